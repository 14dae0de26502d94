# The module of the demo and the controller tests: it plays every role.
# It declares every input the renderer may pass (reference §9.3) and outputs
# every output of every role (§9.4), each once, from one built-in
# terraform_data resource, so init and apply download no provider.
#
# No backend block: this is the child module of the rendered root, which
# holds the backend.

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

# Role inputs. Each role receives only its own, so all default to null; no
# type constraint, so that the renderer's shape is taken as it is.
variable "control_plane_endpoint" {
  default = null
}

variable "kubernetes_version" {
  default = null
}

variable "control_plane_initialized" {
  default = null
}

variable "cluster_network" {
  default = null
}

variable "machine_name" {
  default = null
}

variable "bootstrap_data" {
  default   = null
  sensitive = true
}

variable "bootstrap_format" {
  default = null
}

variable "failure_domain" {
  default = null
}

variable "control_plane" {
  default = null
}

variable "machinepool_name" {
  default = null
}

variable "replicas" {
  default = null
}

variable "failure_domains" {
  default = null
}

variable "cluster_failure_domains" {
  default = null
}

variable "node_labels" {
  default = null
}

variable "autoscaling" {
  default = null
}

# User variables of the samples and tests.
variable "greeting" {
  type    = string
  default = "hello"
}

variable "size" {
  type    = string
  default = "small"
}

variable "message" {
  type    = string
  default = "noop"
}

# Test switches: a slow apply (to watch locks and leases), a failing one,
# and a dump of the environment the runtime gives its provisioners, which
# is the environment tofu itself runs with.
variable "sleep_seconds" {
  type    = number
  default = 0
}

variable "fail" {
  type    = bool
  default = false
}

variable "dump_env" {
  type    = bool
  default = false
}

resource "terraform_data" "run" {
  input = {
    sleep = var.sleep_seconds
    fail  = var.fail
    dump  = var.dump_env
  }
  # Asked to fail, the resource is made anew so that its provisioner runs
  # (and fails) also when an applied instance is changed.
  triggers_replace = var.fail


  provisioner "local-exec" {
    command = join(" && ", compact([
      var.dump_env ? "env > seen-env" : "",
      "sleep ${var.sleep_seconds}",
      var.fail ? "echo 'the noop module was asked to fail' >&2 && exit 3" : "",
    ]))
  }
}

# A failure at plan time, so at the apply's own planning or a guarded
# apply's plan step: nothing is created or replaced.
variable "fail_plan" {
  type    = bool
  default = false
}

resource "terraform_data" "precondition" {
  count = var.fail_plan ? 1 : 0
  lifecycle {
    precondition {
      condition     = !var.fail_plan
      error_message = "the noop module was asked to fail its plan"
    }
  }
}

# A resource that a new generation replaces (a destructive change), absent
# without one.
variable "generation" {
  type    = number
  default = null
}

resource "terraform_data" "generation" {
  count            = var.generation == null ? 0 : 1
  triggers_replace = var.generation
}

# The real world as this module sees it: the content of the file named by
# drift_file (the executor runs pods on this host, so a test's temporary
# file is seen here). Changing the file out of band is drift.
variable "drift_file" {
  type    = string
  default = ""
}

resource "terraform_data" "drift" {
  count = var.drift_file == "" ? 0 : 1
  input = var.drift_file == "" ? "" : trimspace(file(var.drift_file))
}

# A destroy that fails while the file named by destroy_gate exists: the
# resource exists only with a gate, and its destroy-time provisioner checks
# the file (the executor runs pods on this host, so a test's temporary file
# is seen here).
variable "destroy_gate" {
  type    = string
  default = ""
}

resource "terraform_data" "destroy_gate" {
  count = var.destroy_gate == "" ? 0 : 1
  input = var.destroy_gate

  provisioner "local-exec" {
    when    = destroy
    command = "test ! -e ${self.input}"
  }
}

# A destroy that leaves a mark: the file named by destroy_marker is
# written by the destroy-time provisioner, so a test sees that the destroy
# ran; it holds the API_TOKEN the run had (the identity's credentials).
variable "destroy_marker" {
  type    = string
  default = ""
}

resource "terraform_data" "destroy_marker" {
  count = var.destroy_marker == "" ? 0 : 1
  input = var.destroy_marker

  provisioner "local-exec" {
    when    = destroy
    command = "printf '%s' \"$API_TOKEN\" > ${self.input}"
  }
}

locals {
  id       = "noop://${var.captf_object.namespace}/${var.captf_object.name}"
  replicas = var.replicas == null ? 0 : var.replicas
  members  = sort([for i in range(local.replicas) : "${local.id}-${i}"])
}

resource "terraform_data" "noop" {
  input = {
    object   = var.captf_object
    tags     = var.captf_tags
    greeting = var.greeting
    size     = var.size
    message  = var.message
    replicas = local.replicas
  }
}

# Cluster role.
output "control_plane_endpoint" {
  value = var.control_plane_endpoint != null ? var.control_plane_endpoint : {
    host = "${var.captf_object.name}.noop.captf.test"
    port = 6443
  }
}

output "failure_domains" {
  value = [{ name = "noop-a", control_plane = true, attributes = {} }]
}

output "exports" {
  value = {
    cluster  = terraform_data.noop.output.object.name
    greeting = terraform_data.noop.output.greeting
  }
}

# The instance's health as this module reads it: the content of the file
# named by health_file ("running" without one), read again at every
# refresh.
variable "health_file" {
  type    = string
  default = ""
}

locals {
  health_state = var.health_file == "" ? "running" : trimspace(file(var.health_file))
}

output "health" {
  value = { state = local.health_state, healthy = local.health_state == "running" }
}

# Machine role (provider_id also serves the pool role).
output "provider_id" {
  value = local.id
}

output "addresses" {
  value = [
    { type = "InternalIP", address = "192.0.2.10" },
    { type = "Hostname", address = terraform_data.noop.output.object.name },
  ]
}

output "failure_domain" {
  value = var.failure_domain
}

output "interruptible" {
  value = false
}

# Pool role.
output "provider_id_list" {
  value = local.members
}

output "replicas" {
  value = terraform_data.noop.output.replicas
}

output "instances" {
  value = [for id in local.members : { provider_id = id, state = "running" }]
}
