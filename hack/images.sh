#!/usr/bin/env bash
# Builds CAPTF's images without a Docker daemon, as OCI image layouts under
# OUT (default target/images), one folder per image:
#   captf-manager  /manager and /runner (the manager's default runner image)
#   captf-runner   /runner only, for --runner-image
#   captf-module-noop  tests/modules/noop at /captf/module and the pinned tofu
#                  at /captf/runtime (reference §9.1), and a shell for its
#                  provisioner
# Each is one layer on an empty base, linux/amd64, user 65532, with the OCI
# labels of reference §9.1. The binaries are linked statically (glibc's
# crt-static on the gnu target, as `make runner`). crane assembles the images
# in a registry of its own on a loopback port, then writes each out with
# `crane pull --format=oci`; `crane push OUT/<image> <reference>` publishes
# one. Images built from the same binaries have the same digests.
#
# PROFILE: the cargo profile of the binaries (release; `make test` builds
# dev). TAG: the images' tag and version label (the crate's version).
# Prints each image's digest and size.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
. tests/controlplane/versions.env
out="${1:-target/images}"
profile="${PROFILE:-release}"
tag="${TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)}"
source_url="${SOURCE_URL:-https://github.com/captf-io/captf}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
cache="${CAPTF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/captf}"
crane="$cache/bin/crane-v$GGCR_VERSION"
tofu="$cache/bin/tofu-v$OPENTOFU_VERSION"
[ -x "$crane" ] && [ -x "$tofu" ] || tests/controlplane/build.sh >&2

triple=x86_64-unknown-linux-gnu
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
  "${CARGO:-cargo}" build --profile "$profile" --bin captf-manager --bin captf-runner --target "$triple"
bin="target/$triple/$([ "$profile" = dev ] && echo debug || echo "$profile")"

mkdir -p "$out"
# Test binaries may build at once: one builder per folder at a time.
exec 9>"$out/.lock"
flock 9

work="$(mktemp -d)"
registry_pid=
cleanup() {
  status=$?
  [ "$status" = 0 ] || cat "$work/crane.log" >&2 2>/dev/null
  [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT

"$crane" registry serve --address 127.0.0.1:0 2>"$work/registry.log" &
registry_pid=$!
for _ in $(seq 100); do
  port="$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log")"
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/registry.log" >&2; echo "images: the registry did not start" >&2; exit 1; }
registry="127.0.0.1:$port"

# A binary as the image holds it: without its debug information, which a
# dev build carries by the hundred megabytes.
put_binary() {
  install -D -m 0755 "$1" "$2"
  if command -v strip >/dev/null; then strip --strip-debug "$2"; fi
}

# image NAME ENTRYPOINT LABEL=VALUE...: the layer $work/NAME (its files owned
# by root, read-only to the user, with fixed times so that the digest depends
# on the content only), pushed, configured and written to $out/NAME.
image() {
  local name="$1" entrypoint="$2"
  shift 2
  local labels=(
    -l "org.opencontainers.image.source=$source_url"
    -l "org.opencontainers.image.revision=$revision"
    -l "org.opencontainers.image.version=$tag"
    -l "org.opencontainers.image.licenses=Apache-2.0"
  )
  for label in "$@"; do labels+=(-l "$label"); done
  local files
  files="$(cd "$work/$name" && ls -A)"
  # shellcheck disable=SC2086
  tar -C "$work/$name" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    -cf "$work/$name.tar" $files
  "$crane" append --insecure --oci-empty-base -f "$work/$name.tar" -t "$registry/$name:layer" \
    >/dev/null 2>>"$work/crane.log"
  "$crane" mutate --insecure "$registry/$name:layer" --set-platform linux/amd64 --user 65532:65532 \
    --entrypoint "$entrypoint" "${labels[@]}" -t "$registry/$name:$tag" >/dev/null 2>>"$work/crane.log"
  rm -rf "$out/$name.partial"
  "$crane" pull --insecure --format=oci "$registry/$name:$tag" "$out/$name.partial" 2>>"$work/crane.log"
  rm -rf "${out:?}/$name"
  mv "$out/$name.partial" "$out/$name"
  printf 'images: %s:%s %s %.1f MiB\n' "$name" "$tag" "$("$crane" digest --insecure "$registry/$name:$tag")" \
    "$(du -sb "$out/$name" | awk '{ print $1 / 1048576 }')"
}

put_binary "$bin/captf-manager" "$work/captf-manager/manager"
put_binary "$bin/captf-runner" "$work/captf-manager/runner"
image captf-manager /manager

put_binary "$bin/captf-runner" "$work/captf-runner/runner"
image captf-runner /runner

# The noop module's local-exec provisioner runs `sh -c "sleep N && ..."`:
# the module image carries the build host's sh, sleep and env with the
# libraries they load, as a module image on a small base would.
host_program() {
  local path
  path="$(command -v "$1")"
  install -D -m 0755 "$path" "$work/captf-module-noop$2"
  for lib in $(ldd "$path" | grep -o '/[^ ]*' | grep -v ':$'); do
    [ -e "$work/captf-module-noop$lib" ] || install -D -m 0755 "$lib" "$work/captf-module-noop$lib"
  done
}
host_program dash /bin/sh
host_program sleep /bin/sleep
host_program env /usr/bin/env

mkdir -p "$work/captf-module-noop/captf/module"
cp tests/modules/noop/*.tf "$work/captf-module-noop/captf/module/"
chmod 0644 "$work/captf-module-noop/captf/module/"*
install -D -m 0755 "$tofu" "$work/captf-module-noop/captf/runtime"
image captf-module-noop /captf/runtime \
  io.captf.contract=v1alpha1 io.captf.role=machine io.captf.runtime=tofu \
  "io.captf.runtime.version=$OPENTOFU_VERSION"
