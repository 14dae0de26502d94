# Records the environment the runtime gives its provisioners (the runner's
# step environment, inherited) in env.txt in the working directory.

resource "terraform_data" "env" {
  provisioner "local-exec" {
    command = "env > env.txt"
  }
}
