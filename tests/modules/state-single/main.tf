# One built-in resource and outputs of every shape the state reader must
# return: plain and sensitive strings, numbers, lists and objects.
terraform {
  backend "kubernetes" {}
}

variable "message" {
  type    = string
  default = "hello"
}

resource "terraform_data" "one" {
  input = var.message
}

output "plain_string" {
  value = terraform_data.one.output
}

output "plain_number" {
  value = 6443
}

output "plain_big_number" {
  value = 123456789012345678901234567890
}

output "plain_list" {
  value = tolist(["a", "b"])
}

output "plain_object" {
  value = { host = "10.0.0.1", port = 6443 }
}

output "secret_string" {
  value     = "hunter2-${var.message}"
  sensitive = true
}

output "secret_number" {
  value     = 7777123
  sensitive = true
}

output "secret_list" {
  value     = tolist(["s3cr3t-a", "s3cr3t-b"])
  sensitive = true
}

output "secret_object" {
  value     = { token = "t0k3n-xyz", ttl = 3600 }
  sensitive = true
}
