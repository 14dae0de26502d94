#!/usr/bin/env bash
# `make bench`: every benchmark, then one table of their figures and goals
# (the lines each bench prints starting with "| "). The full output is kept
# in target/bench.log.
set -euo pipefail
cd "$(dirname "$0")/.."
log=target/bench.log
mkdir -p target
cargo bench --workspace "$@" 2>&1 | tee "$log"
echo
echo "| bench | figure | measured | goal |"
echo "| --- | --- | --- | --- |"
grep '^| ' "$log"
