# A role module for the runner's tests: one built-in terraform_data resource,
# so init and apply need no provider download.

variable "message" {
  type = string
}

# Sensitive in the root; unused here, so that the runner's redaction has a
# value to know.
variable "password" {
  type    = string
  default = ""
}

resource "terraform_data" "item" {
  input = var.message
}

output "message" {
  value = terraform_data.item.output
}
