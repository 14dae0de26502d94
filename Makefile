# The two set-up commands of the README: `make demo` and `make test`.

CARGO ?= cargo

.PHONY: demo test bench platform runner release-manifests images

# Builds kube-apiserver, kube-controller-manager, etcd, kubectl, tofu and helm from
# source into ~/.cache/captf/bin (skipped when cached).
platform:
	tests/controlplane/build.sh

# The runner is linked statically so that it runs in any role image (glibc's
# crt-static: no musl target can be installed here). The flag must not reach
# build scripts and proc-macros, which an explicit --target keeps it from.
# Output: target/x86_64-unknown-linux-gnu/debug/captf-runner.
RUNNER_TARGET := x86_64-unknown-linux-gnu
runner:
	CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
		$(CARGO) build --bin captf-runner --target $(RUNNER_TARGET)

demo: platform runner
	$(CARGO) build --bin captf-manager --bin captf-runner -p captf -p captf-testkit --bin captf-demo
	target/debug/captf-demo

# Benchmarks are compiled, not run: their figures come from `make bench`.
# Fuzzing runs bounded (fuzz-smoke); long runs are `make fuzz`.
test: platform runner
	$(CARGO) build --workspace --benches
	$(CARGO) test --workspace
	$(MAKE) fuzz-smoke

# Every benchmark, then one table of figures and goals (hack/bench.sh).
bench: platform runner
	hack/bench.sh

# clusterctl's release artifacts in out/: infrastructure-components.yaml,
# metadata.yaml and cluster-template.yaml (README "Installing with clusterctl").
release-manifests:
	hack/release-manifests.sh out

# Coverage-guided fuzzing with cargo fuzz (nightly; fuzz/, hack/fuzz.sh) of the
# AdmissionReview handler, the state reader, the lock info and the runner's
# result document. fuzz-smoke runs each target for FUZZ_SMOKE_SECONDS on a
# copy of the committed corpus; fuzz for FUZZ_SECONDS on a working corpus in
# ~/.cache/captf/fuzz-target/corpus. Either exits non-zero on a finding. FUZZ_TARGETS picks targets.
FUZZ_SMOKE_SECONDS ?= 20
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?=
.PHONY: fuzz fuzz-smoke
fuzz-smoke:
	hack/fuzz.sh smoke $(FUZZ_SMOKE_SECONDS) $(FUZZ_TARGETS)

fuzz:
	hack/fuzz.sh long $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# CAPTF's images as OCI layouts in target/images, built without a Docker
# daemon (hack/images.sh): captf-manager, captf-runner and the noop module.
# PROFILE=dev for a debug build; publish one with
# `crane push target/images/captf-manager <registry>/captf-manager:<tag>`.
PROFILE ?= release
images: platform
	PROFILE=$(PROFILE) hack/images.sh target/images
