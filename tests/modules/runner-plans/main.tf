# A role module for the runner's plan tests: built-in terraform_data only.
# Changing `message` updates in place, `generation` replaces, and `extra`
# adds or deletes.

variable "message" {
  type = string
}

variable "generation" {
  type    = number
  default = 1
}

variable "extra" {
  type    = number
  default = 0
}

resource "terraform_data" "item" {
  input = var.message
}

resource "terraform_data" "generation" {
  triggers_replace = var.generation
}

resource "terraform_data" "extra" {
  count = var.extra
  input = count.index
}

output "message" {
  value = terraform_data.item.output
}
