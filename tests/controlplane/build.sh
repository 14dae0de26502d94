#!/usr/bin/env bash
# Builds the test platform from upstream sources through the Go module proxy:
# kube-apiserver, kube-controller-manager and kubectl (k8s.io/kubernetes), etcd,
# tofu, helm, the Cluster API core, kubeadm bootstrap and kubeadm control plane
# managers and clusterctl, cert-manager's controller, cainjector and webhook
# (cert-manager/), promtool, and crane (which also serves the tests'
# registry), into
# $CAPTF_CACHE_DIR/bin/<name>-<version> (default ~/.cache/captf), outside the
# repository. What is already there is skipped,
# so a second run is instant. Prints what it builds and how long each took.
# Versions: versions.env; the Go module: go.mod (from gen-gomod.sh).
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

# Builds into a temporary directory first so that an interrupted build never
# leaves a half-written binary under the cached name.
TMP="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

elapsed() { echo "$(( $(date +%s) - $1 ))s"; }

K="v$KUBERNETES_VERSION"
missing=()
for cmd in kube-apiserver kube-controller-manager kubectl; do
  if [ -x "$BIN/$cmd-$K" ]; then
    echo "build: $cmd $K cached"
  else
    missing+=("$cmd")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "build: ${missing[*]} $K from k8s.io/kubernetes ..."
  t=$(date +%s)
  minor="${KUBERNETES_VERSION#1.}"; minor="${minor%%.*}"
  # An unstamped version (v0.0.0-master) trips the emulation-version checks.
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
    -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$HERE" && go build -trimpath -ldflags "$ldflags" -o "$TMP/" \
    "${missing[@]/#/k8s.io/kubernetes/cmd/}")
  for cmd in "${missing[@]}"; do mv "$TMP/$cmd" "$BIN/$cmd-$K"; done
  echo "build: ${missing[*]} $K built in $(elapsed "$t")"
fi

ETCD="$BIN/etcd-v$ETCD_VERSION"
if [ -x "$ETCD" ]; then
  echo "build: etcd v$ETCD_VERSION cached"
else
  echo "build: etcd v$ETCD_VERSION from go.etcd.io/etcd/server/v3 ..."
  t=$(date +%s)
  (cd "$HERE" && go build -trimpath -ldflags "-s -w" -o "$TMP/etcd" go.etcd.io/etcd/server/v3)
  mv "$TMP/etcd" "$ETCD"
  echo "build: etcd v$ETCD_VERSION built in $(elapsed "$t")"
fi

TOFU="$BIN/tofu-v$OPENTOFU_VERSION"
# A build without the release stamp calls itself <version>-dev; such a
# binary (from an earlier version of this script) is rebuilt.
if [ -x "$TOFU" ] && [ "$("$TOFU" version -json 2>/dev/null | sed -n 's/.*"terraform_version": *"\([^"]*\)".*/\1/p')" = "$OPENTOFU_VERSION" ]; then
  echo "build: tofu v$OPENTOFU_VERSION cached"
else
  echo "build: tofu v$OPENTOFU_VERSION from github.com/opentofu/opentofu ..."
  t=$(date +%s)
  # Its go.mod has replace directives, so go install refuses it: build inside
  # a writable copy of the downloaded module directory instead.
  dir="$(cd "$TMP" && go mod download -json "github.com/opentofu/opentofu@v$OPENTOFU_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  cp -r "$dir" "$TMP/opentofu"
  chmod -R u+w "$TMP/opentofu"
  (cd "$TMP/opentofu" && GOFLAGS="-buildvcs=false -mod=mod" go build -trimpath \
    -ldflags "-s -w -X github.com/opentofu/opentofu/version.dev=no" -o "$TMP/tofu" ./cmd/tofu)
  mv "$TMP/tofu" "$TOFU"
  echo "build: tofu v$OPENTOFU_VERSION built in $(elapsed "$t")"
fi

HELM="$BIN/helm-v$HELM_VERSION"
if [ -x "$HELM" ]; then
  echo "build: helm v$HELM_VERSION cached"
else
  echo "build: helm v$HELM_VERSION from helm.sh/helm/v3 ..."
  t=$(date +%s)
  (cd "$TMP" && GOBIN="$TMP" GOFLAGS="-buildvcs=false" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION")
  mv "$TMP/helm" "$HELM"
  echo "build: helm v$HELM_VERSION built in $(elapsed "$t")"
fi

CAPI="v$CLUSTER_API_VERSION"
# The core manager, clusterctl, and the kubeadm bootstrap and control plane
# managers that `clusterctl init` installs beside the core by default.
capi_bins=(capi-manager clusterctl capi-kubeadm-bootstrap-manager capi-kubeadm-control-plane-manager)
capi_cached=true
for b in "${capi_bins[@]}"; do [ -x "$BIN/$b-$CAPI" ] || capi_cached=false; done
if $capi_cached; then
  echo "build: ${capi_bins[*]} $CAPI cached"
else
  echo "build: ${capi_bins[*]} $CAPI from sigs.k8s.io/cluster-api ..."
  t=$(date +%s)
  # Its go.mod replaces sigs.k8s.io/cluster-api/api with ./api, a module of its
  # own: build in a writable copy with that module copied in beside it.
  moddir() { (cd "$TMP" && go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'); }
  cp -r "$(moddir "sigs.k8s.io/cluster-api@$CAPI")" "$TMP/capi"
  chmod -R u+w "$TMP/capi"
  rm -rf "$TMP/capi/api"
  cp -r "$(moddir "sigs.k8s.io/cluster-api/api@$CAPI")" "$TMP/capi/api"
  chmod -R u+w "$TMP/capi/api"
  minor="${CLUSTER_API_VERSION#1.}"; minor="${minor%%.*}"
  ldflags="-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$CAPI \
    -X sigs.k8s.io/cluster-api/version.gitMajor=1 -X sigs.k8s.io/cluster-api/version.gitMinor=$minor \
    -X sigs.k8s.io/cluster-api/version.gitTreeState=clean"
  (cd "$TMP/capi" && go build -trimpath -ldflags "$ldflags" -o "$TMP/capi-manager" ./core \
    && go build -trimpath -ldflags "$ldflags" -o "$TMP/clusterctl" ./cmd/clusterctl \
    && go build -trimpath -ldflags "$ldflags" -o "$TMP/capi-kubeadm-bootstrap-manager" ./bootstrap/kubeadm \
    && go build -trimpath -ldflags "$ldflags" -o "$TMP/capi-kubeadm-control-plane-manager" ./controlplane/kubeadm)
  for b in "${capi_bins[@]}"; do mv "$TMP/$b" "$BIN/$b-$CAPI"; done
  echo "build: ${capi_bins[*]} $CAPI built in $(elapsed "$t")"
fi

# cert-manager's controller, cainjector and webhook, which `clusterctl init`
# installs first. Its cmd/* modules are not served by the Go module proxy:
# cert-manager/ wires the same binaries out of the main module's packages
# (its README says what differs).
CM="v$CERT_MANAGER_VERSION"
cm_bins=(controller cainjector webhook)
cm_cached=true
for b in "${cm_bins[@]}"; do [ -x "$BIN/cert-manager-$b-$CM" ] || cm_cached=false; done
if $cm_cached; then
  echo "build: cert-manager ${cm_bins[*]} $CM cached"
else
  echo "build: cert-manager ${cm_bins[*]} $CM from github.com/cert-manager/cert-manager ..."
  t=$(date +%s)
  for b in "${cm_bins[@]}"; do
    (cd "$HERE/cert-manager" && go build -trimpath -ldflags "-s -w" -o "$TMP/cert-manager-$b" "./cmd/$b")
  done
  for b in "${cm_bins[@]}"; do mv "$TMP/cert-manager-$b" "$BIN/cert-manager-$b-$CM"; done
  echo "build: cert-manager ${cm_bins[*]} $CM built in $(elapsed "$t")"
fi

PROMTOOL="$BIN/promtool-v$PROMETHEUS_MODULE_VERSION"
if [ -x "$PROMTOOL" ]; then
  echo "build: promtool v$PROMETHEUS_MODULE_VERSION cached"
else
  echo "build: promtool v$PROMETHEUS_MODULE_VERSION from github.com/prometheus/prometheus ..."
  t=$(date +%s)
  (cd "$TMP" && GOBIN="$TMP" GOFLAGS="-buildvcs=false" go install -trimpath -ldflags "-s -w" \
    "github.com/prometheus/prometheus/cmd/promtool@v$PROMETHEUS_MODULE_VERSION")
  mv "$TMP/promtool" "$PROMTOOL"
  echo "build: promtool v$PROMETHEUS_MODULE_VERSION built in $(elapsed "$t")"
fi

GGCR="v$GGCR_VERSION"
if [ -x "$BIN/crane-$GGCR" ]; then
  echo "build: crane $GGCR cached"
else
  echo "build: crane $GGCR from github.com/google/go-containerregistry ..."
  t=$(date +%s)
  (cd "$TMP" && GOBIN="$TMP" GOFLAGS="-buildvcs=false" go install -trimpath -ldflags "-s -w" \
    "github.com/google/go-containerregistry/cmd/crane@$GGCR")
  mv "$TMP/crane" "$BIN/crane-$GGCR"
  echo "build: crane $GGCR built in $(elapsed "$t")"
fi

built=()
for b in "${capi_bins[@]}"; do built+=("$BIN/$b-$CAPI"); done
for b in "${cm_bins[@]}"; do built+=("$BIN/cert-manager-$b-$CM"); done
ls -l "$BIN"/kube-apiserver-"$K" "$BIN"/kube-controller-manager-"$K" "$BIN"/kubectl-"$K" "$ETCD" "$TOFU" "$HELM" \
  "${built[@]}" "$PROMTOOL" "$BIN/crane-$GGCR" \
  | awk '{ printf "build: %s %.1f MiB\n", $NF, $5 / 1048576 }'
