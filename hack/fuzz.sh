#!/usr/bin/env bash
# Coverage-guided fuzzing with cargo fuzz (libFuzzer, nightly toolchain).
#
#   hack/fuzz.sh smoke [SECONDS] [TARGET...]   `make fuzz-smoke`: each target for
#       SECONDS (default 20) on a temporary copy of fuzz/corpus/<target>;
#       the committed corpus never grows.
#   hack/fuzz.sh long [SECONDS] [TARGET...]    `make fuzz`: each target for SECONDS
#       (default 600) on a working corpus kept in $FUZZ_TARGET_DIR/corpus/<target>
#       (seeded from fuzz/corpus), so that long runs build on each other.
#
# Targets (fuzz/fuzz_targets/): admission_review, state_reader, lock_info,
# run_result; all of them by default. Per target it prints the executions
# (libFuzzer's stat::number_of_executed_units), the executions per second,
# the peak RSS and any finding (crash, panic, OOM, timeout): its input is
# kept under $FUZZ_TARGET_DIR/artifacts/<target>/ and the run exits non-zero.
#
# Environment:
#   FUZZ_TARGET_DIR  cargo target dir of the fuzz build (default
#                    ~/.cache/captf/fuzz-target, outside the clone like the
#                    platform's binaries, so that a fresh clone rebuilds only
#                    the captf crate; it is a build of its own: sanitizer
#                    coverage, release, debug assertions)
#   FUZZ_RSS_MB      libFuzzer's -rss_limit_mb and -malloc_limit_mb (2048)
#   FUZZ_TIMEOUT     seconds one input may take before it counts as a hang (10)
#   FUZZ_SANITIZER   cargo fuzz's -s (none: the crate's only unsafe is two
#                    bounded SSE2 loads; address works too, about 2x slower)
#   FUZZ_ARGS        more libFuzzer flags, e.g. "-fork=2 -ignore_crashes=1"
#   CARGO_FUZZ_ROOT  where cargo-fuzz is installed, once per machine
#                    (~/.cache/captf/cargo-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

mode=${1:-smoke}
case $mode in
smoke) default_seconds=20 ;;
long) default_seconds=600 ;;
*)
    echo "usage: hack/fuzz.sh smoke|long [SECONDS] [TARGET...]" >&2
    exit 2
    ;;
esac
if [ $# -gt 0 ]; then shift; fi
seconds=${1:-$default_seconds}
if [ $# -gt 0 ]; then
    shift
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(admission_review state_reader lock_info run_result)
fi

target_dir=${FUZZ_TARGET_DIR:-$HOME/.cache/captf/fuzz-target}
rss_mb=${FUZZ_RSS_MB:-2048}
timeout=${FUZZ_TIMEOUT:-10}
sanitizer=${FUZZ_SANITIZER:-none}
triple=x86_64-unknown-linux-gnu

# The longest input per target: a termination message and a lock info are
# small (the kubelet keeps 4096 bytes of the former); a review must pass
# 16384 bytes for its object's values to be counted; a state gets room.
max_len() {
    case $1 in
    admission_review) echo 32768 ;;
    state_reader) echo 16384 ;;
    *) echo 4096 ;;
    esac
}

# cargo-fuzz, installed once per machine outside the repository.
cargo_fuzz_version=0.13.2
cargo_fuzz_root=${CARGO_FUZZ_ROOT:-$HOME/.cache/captf/cargo-fuzz}
if ! "$cargo_fuzz_root/bin/cargo-fuzz" --version 2>/dev/null | grep -qx "cargo-fuzz $cargo_fuzz_version"; then
    echo "installing cargo-fuzz $cargo_fuzz_version into $cargo_fuzz_root"
    start=$SECONDS
    cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked --root "$cargo_fuzz_root"
    echo "installed cargo-fuzz in $((SECONDS - start)) s"
fi
export PATH="$cargo_fuzz_root/bin:$PATH"
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "cargo fuzz needs the nightly toolchain (rustup toolchain install nightly)" >&2
    exit 1
fi

start=$SECONDS
mkdir -p "$target_dir"
build_log=$target_dir/fuzz-build.log
build=(cargo +nightly fuzz build --fuzz-dir fuzz -s "$sanitizer" --target-dir "$target_dir")
if [ $# -eq 0 ]; then
    "${build[@]}" >"$build_log" 2>&1 || { cat "$build_log"; exit 1; }
else
    for t in "${targets[@]}"; do
        "${build[@]}" "$t" >"$build_log" 2>&1 || { cat "$build_log"; exit 1; }
    done
fi
grep -v '^ *Compiling ' "$build_log" || true
echo "built ${#targets[@]} fuzz target(s) in $((SECONDS - start)) s"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
summary=()
found=0
for t in "${targets[@]}"; do
    if [ "$mode" = smoke ]; then
        corpus=$scratch/corpus/$t
        mkdir -p "$corpus"
        cp fuzz/corpus/"$t"/* "$corpus"/
    else
        corpus=$target_dir/corpus/$t
        mkdir -p "$corpus"
        cp -n fuzz/corpus/"$t"/* "$corpus"/
    fi
    artifacts=$target_dir/artifacts/$t
    mkdir -p "$artifacts"
    log=$target_dir/fuzz-$t.log
    echo "fuzzing $t for $seconds s (log: $log)"
    status=0
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
    "$target_dir/$triple/release/$t" "$corpus" \
        -max_total_time="$seconds" -timeout="$timeout" \
        -rss_limit_mb="$rss_mb" -malloc_limit_mb="$rss_mb" \
        -max_len="$(max_len "$t")" -dict="fuzz/dict/$t.dict" \
        -artifact_prefix="$artifacts/" -print_final_stats=1 \
        ${FUZZ_ARGS:-} >"$log" 2>&1 || status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    per_second=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    units=$(ls "$corpus" | wc -l)
    crashes=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | sort -u)
    if [ "$status" -ne 0 ] || [ -n "$crashes" ]; then
        found=1
        echo "FINDING in $t (exit $status):"
        grep -E "panicked at|^(==[0-9]+== )?ERROR: libFuzzer|SUMMARY: libFuzzer|^thread '|out-of-memory|timeout after" "$log" | head -10 || true
        grep -A3 "panicked at" "$log" | head -8 || true
        for c in $crashes; do
            echo "  input: $c"
            echo "  replay: $target_dir/$triple/release/$t $c"
        done
        [ -n "$crashes" ] || tail -20 "$log"
    fi
    summary+=("| $t | ${execs:-?} | ${per_second:-?} | ${rss:-?} | $units | ${crashes:-none} |")
done

echo
echo "| target | execs | execs/s | peak RSS MB | corpus | findings |"
echo "| --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${summary[@]}"
exit "$found"
