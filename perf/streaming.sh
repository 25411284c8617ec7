#!/usr/bin/env bash
# Session pub/sub streaming: SESSIONS sessions, each with one WebSocket follower
# (/session/subscribe/s<i>), chunks of ~200 bytes published at RATE/s in all (open loop, 64
# connections, connection i publishing to session i % SESSIONS). Reports chunk latency from
# publish to the follower (p50/p99/p99.9, loadgen's stamped ids), the broker's CPU-µs per chunk,
# and then memory per idle session: IDLE followers attached to sessions of one event each, the
# broker's resident set before and with them. Appends to perf/RESULTS.md.
#
#   bash perf/streaming.sh     (ROUNDS=3 DUR=8 SESSIONS=64 RATES="1000 5000" IDLE=5000; RATES="" measures
#                               idle sessions only)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-8}; SESSIONS=${SESSIONS:-64}; RATES=${RATES-1000 5000}; IDLE=${IDLE:-5000}
PEERS=0 source perf/common.sh
OUT=$ROOT/perf/results/streaming-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
for rate in $RATES; do
  for r in $(seq "$ROUNDS"); do
    dir=$(mktemp -d /var/tmp/evmesh-stream.XXXX); start_broker "$dir" --max-connections $(( IDLE + 200 ))
    taskset -c 1 "$LOADGEN" --url "http://127.0.0.1:18180/session/publish/s{i}" --connections 64 --rate "$rate" \
      --duration "${DUR}s" --warmup 2s --body-bytes 200 --server-pid "$pid" --json "$OUT/$rate-r$r.json" \
      --subscribe-url "ws://127.0.0.1:18180/session/subscribe/s{i}" --subscribers "$SESSIONS" | tee -a "$OUT/log.txt"
    stop_broker "$dir"
  done
done
# Idle sessions: one event each, a follower each, nothing more.
dir=$(mktemp -d /var/tmp/evmesh-stream.XXXX); start_broker "$dir" --max-connections $(( IDLE + 200 ))
python3 perf/lite_topics.py 127.0.0.1:18180 session.idle "$IDLE"
sleep 1; before=$(awk '/VmRSS/{print $2 * 1024}' "/proc/$pid/status")
taskset -c 1 "$LOADGEN" --url "http://127.0.0.1:18180/session/publish/unused" --connections 1 --rate 1 --duration 6s \
  --warmup 3s --subscribe-url "ws://127.0.0.1:18180/session/subscribe/idle{i}" --subscribers "$IDLE" > "$OUT/idle.txt" &
lg=$!
for _ in $(seq 100); do
  open=$(curl -sf 127.0.0.1:18181/metrics | awk '/^evmesh_connections_open/{s+=$2} END{print s+0}')
  [ "$open" -ge "$IDLE" ] && break; sleep 0.1
done
sleep 2; after=$(awk '/VmRSS/{print $2 * 1024}' "/proc/$pid/status")
wait $lg; stop_broker "$dir"
python3 - "$OUT" "$ROUNDS" "$DUR" "$SESSIONS" "$IDLE" "$before" "$after" $RATES <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, statistics as st
out, rounds, dur, sessions, idle, before, after, *rates = sys.argv[1:]
print(f"### session streaming, {os.path.basename(out)}\n")
print(f"{sessions} sessions, one WebSocket follower each (GET /session/subscribe/s<i>), ~200-byte chunks published "
      f"(POST /session/publish/s<i>, 64 connections, open loop) at the rate shown in all, {dur}s per run after 2s "
      f"warm-up, {rounds} rounds; evmesh shards=1, durability os, on core 0, loadgen on core 1. Latency: publish to "
      f"the follower's read.\n")
print("| chunks/s | delivered/s (median) | chunk latency p50 / p99 / p99.9 µs (median) | publish p50 µs | server CPU µs per chunk (median; per round) |")
print("|---|---|---|---|---|")
for rate in rates:
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{rate}-r*.json"))]
    f = [r["fanout"] for r in runs]
    lat = lambda k: int(st.median([x["e2e_latency_us"][k] for x in f]))
    cpu = [x["server_cpu_us_per_delivery"] for x in f if x["server_cpu_us_per_delivery"]]
    pub = int(st.median([r["latency_us"]["p50"] for r in runs]))
    print(f"| {rate} | {int(st.median([x['deliveries_per_s'] for x in f]))} | {lat('p50')} / {lat('p99')} / {lat('p999')} | {pub} | "
          f"{st.median(cpu):.1f} ({', '.join(f'{v:.1f}' for v in cpu)}) |")
per = (int(after) - int(before)) / int(idle)
print(f"\nIdle sessions: {idle} followers attached to sessions of one event each: resident set {int(before) // 1024} KiB "
      f"-> {int(after) // 1024} KiB, **{per:,.0f} bytes per idle session** (its connection, WebSocket buffers and "
      f"follower task, its claim).")
PY
{ echo; echo "Command: \`ROUNDS=$ROUNDS DUR=$DUR SESSIONS=$SESSIONS RATES=\"$RATES\" IDLE=$IDLE bash perf/streaming.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
