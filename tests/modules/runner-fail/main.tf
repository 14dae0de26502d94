# Fails its apply with an error that repeats a secret twice: once from the
# environment (a credential arriving through envFrom) and once from a
# sensitive root variable, unmarked here so that the runtime prints it.

variable "password" {
  type = string
}

resource "terraform_data" "fail" {
  provisioner "local-exec" {
    # The leading newline puts the output's "Error:" at the start of a line
    # of the runtime's diagnostic, where the failure summary looks.
    command = "printf '\\nError: credential %s and password %s\\n' \"$CAPTF_TEST_CREDENTIAL\" '${nonsensitive(var.password)}'; exit 3"
  }
}
