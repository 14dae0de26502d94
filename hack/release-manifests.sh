#!/usr/bin/env bash
# Writes CAPTF's clusterctl release artifacts into a folder (default out/):
# infrastructure-components.yaml (config/release rendered by the pinned
# kubectl's kustomize), metadata.yaml and cluster-template.yaml.
# A local clusterctl repository is this folder under
# infrastructure-terraform/v<version>/.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-out}"
# shellcheck source=/dev/null
. tests/controlplane/versions.env
cache="${CAPTF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/captf}"
kubectl="$cache/bin/kubectl-v$KUBERNETES_VERSION"
[ -x "$kubectl" ] || tests/controlplane/build.sh >&2
mkdir -p "$out"
"$kubectl" kustomize config/release > "$out/infrastructure-components.yaml.tmp"
mv "$out/infrastructure-components.yaml.tmp" "$out/infrastructure-components.yaml"
cp metadata.yaml "$out/metadata.yaml"
cp templates/cluster-template.yaml "$out/cluster-template.yaml"
