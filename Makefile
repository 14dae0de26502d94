# The two set-up commands of the README: `make demo` and `make test`.

CARGO ?= cargo

.PHONY: demo test platform

# Builds kube-apiserver, kube-controller-manager, etcd, kubectl and tofu from
# source into ~/.cache/captf/bin (skipped when cached).
platform:
	tests/controlplane/build.sh

demo: platform
	$(CARGO) build --bin captf-manager --bin captf-runner -p captf -p captf-testkit --bin captf-demo
	target/debug/captf-demo

test: platform
	$(CARGO) test --workspace --all-targets
