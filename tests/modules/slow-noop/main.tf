# A module with no provider to download: the built-in terraform_data resource,
# slowed by a local-exec provisioner so that a test can watch the state lock
# while the apply runs.
terraform {
  backend "kubernetes" {}
}

variable "sleep_seconds" {
  type    = number
  default = 0
}

variable "message" {
  type    = string
  default = "hello"
}

resource "terraform_data" "slow" {
  input = var.message

  provisioner "local-exec" {
    command = "sleep ${var.sleep_seconds}"
  }
}

output "message" {
  value = terraform_data.slow.output
}
