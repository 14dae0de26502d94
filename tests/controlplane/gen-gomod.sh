#!/usr/bin/env bash
# Regenerates go.mod and go.sum of the control-plane module from the pinned
# Kubernetes release's own go.mod: one replace line per staging module that the
# release requires at v0.0.0, pointing at its published v0.<minor>.<patch> tag.
# Run it only when versions.env changes; build.sh uses the committed result.
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=versions.env
. ./versions.env
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

K=v$KUBERNETES_VERSION
STAGING=v0.${KUBERNETES_VERSION#1.}
go mod download "k8s.io/kubernetes@$K"
MOD="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K.mod"

rm -f go.mod go.sum
go mod init captf.test/controlplane
# The go and godebug lines apply only in the main module, so copy them over.
grep -E '^(go|godebug) ' "$MOD" | while read -r key value; do
  case "$key" in
    go) go mod edit -go="$value" ;;
    godebug) go mod edit -godebug="$value" ;;
  esac
done
for m in $(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$MOD"); do
  go mod edit -replace="$m=$m@$STAGING"
done
go mod edit -require="k8s.io/kubernetes@$K" -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
# Tool directives, not `go get -tool`: go get would upgrade the release past the pin.
go mod edit -tool=k8s.io/kubernetes/cmd/kube-apiserver \
  -tool=k8s.io/kubernetes/cmd/kube-controller-manager -tool=k8s.io/kubernetes/cmd/kubectl \
  -tool=go.etcd.io/etcd/server/v3
go mod tidy
# Fail loudly if resolution lifted a module above what the release pins.
for m in k8s.io/kube-openapi sigs.k8s.io/structured-merge-diff/v6 go.etcd.io/etcd/server/v3; do
  want=$(awk -v m="$m" '$1 == m { print $2 }' "$MOD")
  got=$(go list -m -f '{{.Version}}' "$m")
  if [ "$want" != "$got" ]; then
    echo "gen-gomod: $m resolved to $got, the release pins $want" >&2
    exit 1
  fi
done
echo "gen-gomod: go.mod for Kubernetes $K, staging modules at $STAGING, etcd v$ETCD_VERSION"
