# A resource with for_each over two keys: one managed resource with two
# instances.
terraform {
  backend "kubernetes" {}
}

resource "terraform_data" "each" {
  for_each = toset(["blue", "green"])
  input    = each.key
}

output "keys" {
  value = sort(keys(terraform_data.each))
}
