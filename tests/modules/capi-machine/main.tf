# A cloud's machine for the Cluster API tests: the machine role's inputs
# (reference §9.3) with their types and its outputs (§9.4), from one
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
variable "machine_name" {
  type = string
}

variable "bootstrap_data" {
  type      = string
  sensitive = true
}

variable "bootstrap_format" {
  type = string

  validation {
    condition     = contains(["cloud-config", "ignition"], var.bootstrap_format)
    error_message = "bootstrap_format is cloud-config or ignition."
  }
}

variable "failure_domain" {
  type    = string
  default = null
}

variable "kubernetes_version" {
  type    = string
  default = null
}

variable "control_plane" {
  type = bool
}

# Test switches: another provider ID, none at all, another health state
# (anything but running is unhealthy).
variable "provider_id_override" {
  type    = string
  default = ""
}

variable "null_provider_id" {
  type    = bool
  default = false
}

variable "health_state" {
  type    = string
  default = "running"
}

locals {
  provider_id = var.provider_id_override != "" ? var.provider_id_override : "captf-test://${var.captf_object.namespace}/${var.machine_name}"
  # 10.0.0.1 to 10.0.0.254, the same for the same name.
  host = parseint(substr(sha256(var.machine_name), 0, 4), 16) % 254 + 1
}

# What arrived, kept in the resource too: the rendered root re-exports only
# the role's outputs, so a test reads bootstrap_digest and seen_exports
# from the state's resource.
resource "terraform_data" "machine" {
  input = {
    object           = var.captf_object
    tags             = var.captf_tags
    machine_name     = var.machine_name
    bootstrap_digest = nonsensitive(sha256(base64decode(var.bootstrap_data)))
    seen_exports     = jsonencode(var.captf_cluster_outputs)
  }
}

output "provider_id" {
  value = var.null_provider_id ? null : local.provider_id
}

output "addresses" {
  value = [
    { type = "InternalIP", address = "10.0.0.${local.host}" },
    { type = "Hostname", address = terraform_data.machine.output.machine_name },
  ]
}

output "failure_domain" {
  value = var.failure_domain
}

output "interruptible" {
  value = false
}

output "health" {
  value = { state = var.health_state, healthy = var.health_state == "running" }
}

output "bootstrap_digest" {
  value = terraform_data.machine.output.bootstrap_digest
}

output "seen_exports" {
  value = terraform_data.machine.output.seen_exports
}
