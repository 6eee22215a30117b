#!/usr/bin/env bash
# Long fuzz run: every fuzz target for SECONDS seconds each (default 1800, i.e. 30 minutes),
# through scripts/fuzz-smoke.sh, then a markdown table of the result (target, executions,
# coverage as libFuzzer counts it: edges and features, corpus size, crashes) written to target/fuzz-long.md, to be copied into docs/security.md.
# Exits non-zero if any target crashed (the crashing input stays under fuzz/artifacts/).
#
#   scripts/fuzz-long.sh [SECONDS]
#
# NDD_FUZZ_TARGETS and NDD_FUZZ_PARALLEL pass through to fuzz-smoke.sh (a subset of the
# targets; several at once, niced).
set -euo pipefail

secs="${1:-1800}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mkdir -p target
log="target/fuzz-long.log"
# The commit the targets are built from (HEAD may move while they run).
commit="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo '+changes')"
status=0
bash scripts/fuzz-smoke.sh "$secs" 2>&1 | tee "$log" || status=$?
{
    echo "Fuzz run of $(date -u +%Y-%m-%d), ${secs} s per target, ${NDD_FUZZ_PARALLEL:-1} at once on $(nproc) cores, commit $commit:"
    echo
    echo "| target | executions | coverage (edges) | features | corpus inputs | result |"
    echo "|---|---:|---:|---:|---:|---|"
    sed -n 's/^fuzz-smoke: \([a-z_]*\) ok (\([0-9?]*\) runs, cov \([0-9?]*\) edges, ft \([0-9?]*\) features, corpus \([0-9]*\) inputs)$/| `\1` | \2 | \3 | \4 | \5 | no crash |/p' "$log"
    sed -n 's/^fuzz-smoke: \([a-z_]*\) FAILED.*$/| `\1` | | | | | **crashed** (fuzz\/artifacts\/\1\/) |/p' "$log"
} >target/fuzz-long.md
cat target/fuzz-long.md
exit "$status"
