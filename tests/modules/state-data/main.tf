# A data source and no managed resource: the built-in terraform_remote_state
# reads a local state file the test writes next to this module.
terraform {
  backend "kubernetes" {}
}

data "terraform_remote_state" "upstream" {
  backend = "local"
  config = {
    path = "${path.module}/upstream.tfstate"
  }
}

output "upstream_greeting" {
  value = data.terraform_remote_state.upstream.outputs.greeting
}
