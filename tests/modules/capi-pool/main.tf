# A cloud's machine pool for the Cluster API tests: the machine pool role's
# inputs (reference §9.3) with their types and its outputs (§9.4), from one
# built-in terraform_data resource, so init and apply download no provider.
#
# No backend block: this is the child module of the rendered root.

# Common inputs.
variable "captf_contract" {
  type = string
}

variable "captf_cluster" {
  type = object({
    name      = string
    namespace = string
  })
  default = null
}

variable "captf_object" {
  type = object({
    kind      = string
    name      = string
    namespace = string
  })
}

variable "captf_tags" {
  type = map(string)
}

variable "captf_cluster_outputs" {
  type    = any
  default = null
}

# Role inputs.
variable "machinepool_name" {
  type = string
}

variable "replicas" {
  type = number
}

variable "bootstrap_data" {
  type      = string
  sensitive = true
}

variable "bootstrap_format" {
  type = string
}

variable "failure_domains" {
  type = list(string)
}

variable "cluster_failure_domains" {
  type = list(string)
}

variable "kubernetes_version" {
  type    = string
  default = null
}

variable "node_labels" {
  type = map(string)
}

variable "autoscaling" {
  type = object({
    enabled = bool
    min     = number
    max     = number
  })
}

# Test switch: the count a cloud's autoscaler scaled the group to. It
# counts only while autoscaling is on, when a real module ignores changes
# of the desired count (§9.5).
variable "cloud_scaled_to" {
  type    = number
  default = null
}

# The real world as this module sees it: the content of the file named by
# drift_file. Changing the file out of band is drift.
variable "drift_file" {
  type    = string
  default = ""
}

resource "terraform_data" "drift" {
  count = var.drift_file == "" ? 0 : 1
  input = var.drift_file == "" ? "" : trimspace(file(var.drift_file))
}

resource "terraform_data" "pool" {
  input = {
    object   = var.captf_object
    tags     = var.captf_tags
    replicas = var.autoscaling.enabled && var.cloud_scaled_to != null ? var.cloud_scaled_to : var.replicas
  }
}

locals {
  # sort() as the contract asks of the list (§9.5).
  members = sort([
    for i in range(terraform_data.pool.output.replicas) :
    "captf-test://${var.captf_object.namespace}/${var.machinepool_name}-${i}"
  ])
}

# The pool's own ID, for a cloud that has one for the group; by default
# none, and the members carry the IDs.
variable "group_provider_id" {
  type    = string
  default = ""
}

output "provider_id" {
  value = var.group_provider_id == "" ? null : var.group_provider_id
}

output "provider_id_list" {
  value = local.members
}

output "replicas" {
  value = terraform_data.pool.output.replicas
}

output "instances" {
  value = [for id in local.members : { provider_id = id, state = "running" }]
}

output "health" {
  value = { state = "running", healthy = true }
}
