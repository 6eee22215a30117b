#!/usr/bin/env bash
# Fuzz smoke test: seed the corpus from the wire test vectors, build every fuzz target and
# run each one for SECONDS seconds (default 10). Exits non-zero if any target crashes (a
# panic, an assertion, an overflow) or fails to build; a crashing input is kept under
# fuzz/artifacts/<target>/ and the end of the fuzzer's log is printed.
#
#   scripts/fuzz-smoke.sh [SECONDS]
#
# NDD_FUZZ_TARGETS="frame image" runs only those targets; NDD_FUZZ_PARALLEL=N runs N targets
# at once (each under `nice`, so a build or test beside it keeps priority; the executions
# each one reached are in the result line).
#
# Works on stable Rust without cargo-fuzz: the targets are built with
# `cargo build --release --manifest-path fuzz/Cargo.toml` and the sanitizer-coverage flags
# cargo-fuzz would pass (no AddressSanitizer; the wire crate is `forbid(unsafe_code)`). If
# `cargo fuzz` and a nightly toolchain are both installed, `cargo +nightly fuzz run` is used
# instead (with AddressSanitizer); set NDD_FUZZ_STABLE=1 to force the stable path.
set -euo pipefail

secs="${1:-10}"
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [ "$secs" -lt 1 ]; then
    echo "usage: $0 [SECONDS]   (a whole number of seconds per target, default 10)" >&2
    exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
all_targets=(frame control handshake records session image)
read -r -a targets <<<"${NDD_FUZZ_TARGETS:-${all_targets[*]}}"
for t in "${targets[@]}"; do
    if ! [[ " ${all_targets[*]} " == *" $t "* ]]; then
        echo "fuzz-smoke: unknown target '$t' (targets: ${all_targets[*]})" >&2
        exit 2
    fi
done
parallel="${NDD_FUZZ_PARALLEL:-1}"
if ! [[ "$parallel" =~ ^[0-9]+$ ]] || [ "$parallel" -lt 1 ]; then
    echo "fuzz-smoke: NDD_FUZZ_PARALLEL must be a whole number >= 1" >&2
    exit 2
fi

bash fuzz/seed-corpus.sh
mkdir -p fuzz/artifacts

use_cargo_fuzz=0
if [ "${NDD_FUZZ_STABLE:-0}" != 1 ] &&
    cargo fuzz --version >/dev/null 2>&1 &&
    cargo +nightly --version >/dev/null 2>&1; then
    use_cargo_fuzz=1
fi

host="$(rustc -vV | sed -n 's/^host: //p')"
if [ "$use_cargo_fuzz" = 1 ]; then
    echo "fuzz-smoke: using cargo +nightly fuzz"
    cargo +nightly fuzz build --release
else
    echo "fuzz-smoke: building with stable rustc and sanitizer coverage (target $host)"
    # What cargo-fuzz passes, minus -Zsanitizer. `--target` keeps these flags off build
    # scripts and proc macros, which must not be instrumented.
    export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
-Cdebug-assertions -Coverflow-checks"
    export CARGO_TARGET_DIR="$root/fuzz/target"
    cargo build --release --manifest-path fuzz/Cargo.toml --target "$host" --bins
fi

# One target: its command line; the result line comes from report().
command_for() {
    local t="$1"
    local args=(-max_total_time="$secs" -artifact_prefix="fuzz/artifacts/$t/" -print_final_stats=1)
    if [ "$use_cargo_fuzz" = 1 ]; then
        echo cargo +nightly fuzz run --release "$t" "fuzz/corpus/$t" -- "${args[@]}"
    else
        echo "fuzz/target/$host/release/$t" "${args[@]}" "fuzz/corpus/$t"
    fi
}

failed=()
report() {
    local t="$1" rc="$2" log="fuzz/artifacts/$1.log"
    if [ "$rc" = 0 ]; then
        local runs cov ft
        runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
        # Coverage from libFuzzer's last status line: edges (cov) and features (ft).
        cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)"
        ft="$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)"
        echo "fuzz-smoke: $t ok (${runs:-?} runs, cov ${cov:-?} edges, ft ${ft:-?} features, corpus $(find "fuzz/corpus/$t" -type f | wc -l) inputs)"
    else
        echo "fuzz-smoke: $t FAILED; last lines of $log:" >&2
        tail -n 40 "$log" >&2
        failed+=("$t")
    fi
}

# Runs the targets, at most $parallel at once (in order of the list).
running=()
wait_oldest() {
    local entry="${running[0]}"
    running=("${running[@]:1}")
    local rc=0
    wait "${entry%%:*}" || rc=$?
    report "${entry#*:}" "$rc"
}
for t in "${targets[@]}"; do
    mkdir -p "fuzz/artifacts/$t"
    echo "fuzz-smoke: running $t for ${secs}s"
    read -r -a cmd <<<"$(command_for "$t")"
    if [ "$parallel" = 1 ]; then
        rc=0
        "${cmd[@]}" >"fuzz/artifacts/$t.log" 2>&1 || rc=$?
        report "$t" "$rc"
    else
        nice -n 10 "${cmd[@]}" >"fuzz/artifacts/$t.log" 2>&1 &
        running+=("$!:$t")
        if [ "${#running[@]}" -ge "$parallel" ]; then
            wait_oldest
        fi
    fi
done
while [ "${#running[@]}" -gt 0 ]; do
    wait_oldest
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz-smoke: crashed: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz-smoke: all ${#targets[@]} targets ran ${secs}s without a crash"
