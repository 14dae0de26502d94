# A cloud's cluster for the Cluster API tests: the cluster role's inputs
# (reference §9.3) with their types and its outputs (§9.4), from one
# built-in terraform_data resource, so init and apply download no provider.
#
# No backend block: this is the child module of the rendered root. No
# captf_cluster_outputs either: the cluster role never receives it (§9.2).

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

# Role inputs.
variable "control_plane_endpoint" {
  type = object({
    host = string
    port = number
  })
  default = null
}

variable "kubernetes_version" {
  type    = string
  default = null
}

variable "control_plane_initialized" {
  type = bool
}

variable "cluster_network" {
  type = object({
    pods            = list(string)
    services        = list(string)
    service_domain  = string
    api_server_port = number
  })
  default = null
}

# Test switch: the health state to report (anything but running is
# unhealthy).
variable "health_state" {
  type    = string
  default = "running"
}

# Test switch: any input change that changes a resource in place.
variable "note" {
  type    = string
  default = ""
}

# Test switch: an apply that takes this long (a resource made anew for
# each note, whose provisioner sleeps).
variable "sleep_seconds" {
  type    = number
  default = 0
}

resource "terraform_data" "slow" {
  count            = var.sleep_seconds > 0 ? 1 : 0
  triggers_replace = var.note
  provisioner "local-exec" {
    command = "sleep ${var.sleep_seconds}"
  }
}

resource "terraform_data" "cluster" {
  input = {
    note    = var.note
    object  = var.captf_object
    tags    = var.captf_tags
    network = "net-${var.captf_object.namespace}-${var.captf_object.name}"
    # What arrived, for the tests to read from the state.
    control_plane_initialized = var.control_plane_initialized
  }
}

# An endpoint only when none was given: the module's output is written only
# then, and must stay null otherwise.
output "control_plane_endpoint" {
  value = var.control_plane_endpoint != null ? null : {
    host = "${var.captf_object.name}.${var.captf_object.namespace}.captf.test"
    port = 6443
  }
}

output "failure_domains" {
  value = [
    { name = "fd-a", control_plane = true, attributes = {} },
    { name = "fd-b", control_plane = false, attributes = {} },
  ]
}

output "exports" {
  value = {
    cluster = terraform_data.cluster.output.object.name
    network = terraform_data.cluster.output.network
  }
}

output "health" {
  value = { state = var.health_state, healthy = var.health_state == "running" }
}
