# OpenTofu's client-side state encryption with its built-in key provider and
# method: the state Secret holds the encryption envelope, not a state.
terraform {
  backend "kubernetes" {}

  encryption {
    key_provider "pbkdf2" "test" {
      passphrase = "correct-horse-battery-staple"
    }
    method "aes_gcm" "test" {
      keys = key_provider.pbkdf2.test
    }
    state {
      method = method.aes_gcm.test
    }
  }
}

resource "terraform_data" "one" {
  input = "encrypted"
}

output "secret" {
  value     = "never-readable"
  sensitive = true
}
