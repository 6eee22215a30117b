#!/usr/bin/env bash
# A small stream beside a bulk one across a slow link, as a user would see it: two network
# namespaces joined by a veth pair, `tc tbf` shaping both ends (netem is absent here), two
# `ndd run` processes over TLS. Prints the small stream's one-way p50/p99 and the bulk rate as
# the app side's --stats-json reports them, for `chunk_bytes` as shipped and 0 (frames whole).
#
#   sudo scripts/shaped-link.sh [RATE] [RUNS]      RATE: tc rate (default 20mbit), RUNS: per row
#
# Environment: CHUNK (the cut row's chunk_bytes, default 4096), BULK_COUNT (bulk frames,
# default 500; 1 leaves the small stream alone), NDD_ENV (VAR=value for both ndd processes),
# SS_PROBE=1 (print `ss -tinm` and the shaper's backlog 4 s into each run).
#
# Needs root (namespaces), `ip` and `tc` (iproute2), python3, and a built target/release/ndd.
set -euo pipefail
RATE=${1:-20mbit}
RUNS=${2:-3}
cd "$(dirname "$0")/.."
NDD=$PWD/target/release/ndd
[ -x "$NDD" ] || { echo "build first: cargo build --release -p ndd-cli" >&2; exit 1; }
command -v tc >/dev/null || { echo "tc not found: apt-get install iproute2" >&2; exit 1; }
A=ndd-shaped-app D=ndd-shaped-dev
W=$(mktemp -d /tmp/ndd-shaped.XXXXXX)
cleanup() {
  pkill -f "$W/" 2>/dev/null || true
  ip netns del $A 2>/dev/null || true
  ip netns del $D 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
cleanup 2>/dev/null || true
W=$(mktemp -d /tmp/ndd-shaped.XXXXXX)
ip netns add $A
ip netns add $D
ip link add va netns $A type veth peer name vd netns $D
ip -n $A addr add 10.77.0.1/24 dev va
ip -n $D addr add 10.77.0.2/24 dev vd
for ns in $A $D; do ip -n $ns link set lo up; done
ip -n $A link set va up
ip -n $D link set vd up
ip netns exec $A tc qdisc add dev va root tbf rate "$RATE" burst 32kbit latency 50ms
ip netns exec $D tc qdisc add dev vd root tbf rate "$RATE" burst 32kbit latency 50ms

"$NDD" id --home "$W/a" >/dev/null
"$NDD" id --home "$W/d" >/dev/null
"$NDD" trust "$("$NDD" id --home "$W/d")" --home "$W/a" >/dev/null
"$NDD" trust "$("$NDD" id --home "$W/a")" --home "$W/d" >/dev/null

run() { # $1 chunk_bytes, $2 run number
  cat >"$W/shaped.toml" <<TOML
driver = "shaped"
[link]
chunk_bytes = $1
[[stream]]
name = "mouse"
direction = "device-to-app"
reliability = "lossy"
priority = "high"
source = { type = "synthetic", size = 14, interval_ms = 4.0, count = 2500 }
sink = { type = "null" }
[[stream]]
name = "bulk"
direction = "device-to-app"
source = { type = "synthetic", size = 100000, interval_ms = 20.0, count = ${BULK_COUNT:-500} }
sink = { type = "null" }
TOML
  rm -f "$W/app.json"
  ip netns exec $A env ${NDD_ENV:-X=1} "$NDD" run "$W/shaped.toml" --side app --listen 10.77.0.1:7700 \
    --home "$W/a" --once --stats-json "$W/app.json" >"$W/app.log" 2>&1 &
  local app=$!
  sleep 0.5
  [ -n "${SS_PROBE:-}" ] && (sleep 4; ip netns exec $D ss -tinm state established; ip netns exec $D tc -s qdisc show dev vd) &
  ip netns exec $D env ${NDD_ENV:-X=1} timeout 60 "$NDD" run "$W/shaped.toml" --side device \
    --connect 10.77.0.1:7700 --home "$W/d" --once >"$W/dev.log" 2>&1 || true
  # The bulk stream is oversubscribed (40 Mbit/s offered): the app side ends once it has all.
  for _ in $(seq 1 600); do kill -0 $app 2>/dev/null || break; sleep 0.1; done
  kill $app 2>/dev/null || true
  wait $app 2>/dev/null || true
  python3 - "$W/app.json" "$1" "$2" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"chunk_bytes {sys.argv[2]:>6} run {sys.argv[3]}: no stats ({e})"); sys.exit(0)
m, b = v["streams"][0], v["streams"][1]
print(f"chunk_bytes {sys.argv[2]:>6} run {sys.argv[3]}: mouse p50 {m.get('latency_p50_ms') or float('nan'):7.1f} ms "
      f"p99 {m.get('latency_p99_ms') or float('nan'):7.1f} ms ({m['frames']} frames); "
      f"bulk p50 {b.get('latency_p50_ms') or float('nan'):7.0f} ms ({b['frames']} frames)")
PY
}
echo "link: veth, tc tbf rate $RATE burst 32kbit latency 50ms both ways; TLS; mouse 14 B every 4 ms (lossy, high) beside 100 KB every 20 ms (reliable)"
for r in $(seq 1 "$RUNS"); do
  run ${CHUNK:-4096} "$r"
  run 0 "$r"
done
