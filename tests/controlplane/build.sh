#!/usr/bin/env bash
# Builds the test platform from upstream sources through the Go module proxy:
# kube-apiserver, kube-controller-manager, etcd and tofu, into
# $CAPTF_CACHE_DIR/bin/<name>-<version> (default ~/.cache/captf), outside the
# repository. What is already there is skipped, so a second run is instant.
# Prints what it builds and how long each took. Versions: versions.env.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
. "$HERE/versions.env"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly"

CACHE="${CAPTF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/captf}"
BIN="$CACHE/bin"
mkdir -p "$BIN" "$CACHE/src"

# Test binaries and the demo may call this at once: one builder at a time.
exec 9>"$CACHE/build.lock"
flock 9

K="v$KUBERNETES_VERSION"
APISERVER="$BIN/kube-apiserver-$K"
KCM="$BIN/kube-controller-manager-$K"
ETCD="$BIN/etcd-v$ETCD_VERSION"
TOFU="$BIN/tofu-v$OPENTOFU_VERSION"

elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

# Builds into a temporary directory first so that an interrupted build never
# leaves a half-written binary under the cached name.
TMP="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

if [ ! -x "$APISERVER" ] || [ ! -x "$KCM" ]; then
  echo "build: kube-apiserver and kube-controller-manager $K from k8s.io/kubernetes ..."
  t=$(date +%s)
  minor="${KUBERNETES_VERSION#1.}"; minor="${minor%%.*}"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
    -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$HERE" && go build -trimpath -ldflags "$ldflags" -o "$TMP/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
  mv "$TMP/kube-apiserver" "$APISERVER"
  mv "$TMP/kube-controller-manager" "$KCM"
  echo "build: kube-apiserver and kube-controller-manager $K built in $(elapsed "$t")"
else
  echo "build: kube-apiserver and kube-controller-manager $K cached"
fi

if [ ! -x "$ETCD" ]; then
  echo "build: etcd v$ETCD_VERSION from go.etcd.io/etcd/server/v3 ..."
  t=$(date +%s)
  (cd "$HERE" && go build -trimpath -ldflags "-s -w" -o "$TMP/etcd" go.etcd.io/etcd/server/v3)
  mv "$TMP/etcd" "$ETCD"
  echo "build: etcd v$ETCD_VERSION built in $(elapsed "$t")"
else
  echo "build: etcd v$ETCD_VERSION cached"
fi

if [ ! -x "$TOFU" ]; then
  echo "build: tofu v$OPENTOFU_VERSION from github.com/opentofu/opentofu ..."
  t=$(date +%s)
  # Its go.mod has replace directives, so go install refuses it: build inside
  # a writable copy of the downloaded module directory instead.
  dir="$(cd "$TMP" && go mod download -json "github.com/opentofu/opentofu@v$OPENTOFU_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  src="$CACHE/src/opentofu-v$OPENTOFU_VERSION"
  rm -rf "$src"
  cp -r "$dir" "$src"
  chmod -R u+w "$src"
  (cd "$src" && GOFLAGS="-buildvcs=false -mod=mod" go build -trimpath -ldflags "-s -w" -o "$TMP/tofu" ./cmd/tofu)
  mv "$TMP/tofu" "$TOFU"
  rm -rf "$src"
  echo "build: tofu v$OPENTOFU_VERSION built in $(elapsed "$t")"
else
  echo "build: tofu v$OPENTOFU_VERSION cached"
fi

ls -l "$APISERVER" "$KCM" "$ETCD" "$TOFU" | awk '{ printf "build: %s %.1f MiB\n", $NF, $5 / 1048576 }'
