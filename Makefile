# The two set-up commands of the README: `make demo` and `make test`.

CARGO ?= cargo

.PHONY: demo test bench platform

# Builds kube-apiserver, kube-controller-manager, etcd, kubectl, tofu and helm from
# source into ~/.cache/captf/bin (skipped when cached).
platform:
	tests/controlplane/build.sh

demo: platform
	$(CARGO) build --bin captf-manager --bin captf-runner -p captf -p captf-testkit --bin captf-demo
	target/debug/captf-demo

# Benchmarks are compiled, not run: their figures come from `make bench`.
test: platform
	$(CARGO) build --workspace --benches
	$(CARGO) test --workspace

bench: platform
	$(CARGO) bench --workspace
