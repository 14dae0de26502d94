# Leaks seeded secrets and fails (tests/redaction.rs): its apply prints the
# variables the Job got from its credentials Secret and from a secretKeyRef
# as they are, then the file named by leak_file, which holds each seeded
# secret in every escaped and encoded form, and exits 3. The file's last
# line, " Error: ...", reaches the failure summary; all of it reaches the
# logs. The runner must redact all of it.
#
# It declares the cluster role's inputs (reference §9.3) loosely, so that
# the rendered root passes them; it never gets to its outputs.

variable "captf_contract" {
  default = null
}

variable "captf_cluster" {
  default = null
}

variable "captf_object" {
  default = null
}

variable "captf_tags" {
  default = null
}

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

# An absolute path on the executor's host, which runs pods there.
variable "leak_file" {
  type = string
}

resource "terraform_data" "leak" {
  input = var.leak_file

  provisioner "local-exec" {
    command = "printf '%s\\n' \"$SEEDED_ENV_TOKEN\" \"$aws_credentials\" \"$kubeconfig\" \"$sa_key_json\"; cat '${var.leak_file}'; exit 3"
  }
}
