# A resource with count = 3: one managed resource with three instances.
terraform {
  backend "kubernetes" {}
}

resource "terraform_data" "many" {
  count = 3
  input = "instance-${count.index}"
}

output "inputs" {
  value = terraform_data.many[*].output
}
