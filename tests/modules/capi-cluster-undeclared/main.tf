# A cluster module that forgets two of the outputs its role must declare
# (failure_domains and exports, reference §9.4): it applies, and CAPTF
# reports OutputsMissing instead of taking them for null ones.

variable "captf_contract" {}
variable "captf_cluster" { default = null }
variable "captf_object" {}
variable "captf_tags" {}
variable "control_plane_endpoint" { default = null }
variable "kubernetes_version" { default = null }
variable "control_plane_initialized" {}
variable "cluster_network" { default = null }

resource "terraform_data" "cluster" {
  input = var.captf_object.name
}

output "control_plane_endpoint" {
  value = { host = "${terraform_data.cluster.output}.captf.test", port = 6443 }
}

output "health" {
  value = { state = "running", healthy = true }
}
