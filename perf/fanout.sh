#!/usr/bin/env bash
# Fan-out benchmark: one topic, SUBS WebSocket subscribers, publishers at a fixed RATE, evmesh
# (a BROADCAST subscription, ack=none; with ACK=1 acknowledged sessions whose subscribers ack
# every event) beside nginx+nchan (/sub WebSocket subscribers of one channel; nchan has no
# acks, so it runs the same either way), the same loadgen in alternation over ROUNDS. Reports
# server CPU-µs per delivery, deliveries/s and publish-to-delivery latency; appends a table to
# perf/RESULTS.md.
#
#   bash perf/fanout.sh        (ROUNDS=3 DUR=8 SUBS=100 RATE=1000 SHARDS=1 ACK=0 env knobs;
#                               EVMESH_FLAGS="--delivery-linger-us 5000" passes serve flags;
#                               BEFORE=/path/to/old/evmesh adds that build to every round, as
#                               "before", beside this checkout's, "after"; NCHAN=0 leaves nchan
#                               out: past 8,000 subscribers its worker_connections refuses them)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-8}; SUBS=${SUBS:-100}; RATE=${RATE:-1000}; SHARDS=${SHARDS:-1}; ACK=${ACK:-0}
EVMESH_FLAGS=${EVMESH_FLAGS:-}
if [ "$ACK" = 1 ]; then EV_QUERY="subscription=fan"; EV_ACK=(--ack); MODE="acknowledged, every event acked"
else EV_QUERY="subscription=fan&ack=none"; EV_ACK=(); MODE="ack=none"; fi
source perf/fdlimit.sh
raise_fd_limit "$SUBS"
source perf/common.sh
OUT=$ROOT/perf/results/fanout-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
BUILDS=(evmesh)
if [ -n "${BEFORE:-}" ]; then
  BUILDS=(before after); cp "$BEFORE" "$OUT/.before-bin"; trap 'rm -f "$OUT/.before-bin"' EXIT
fi
# Attaching thousands of subscribers takes a while: keep it out of the measured window.
WARMUP=$(( SUBS / 2000 + 2 ))
load() { # name publish-url subscribe-url pid [--ack]
  "$LOADGEN" --url "$2" --connections 8 --duration "${DUR}s" --warmup "${WARMUP}s" --rate "$RATE" \
    --subscribe-url "$3" --subscribers "$SUBS" --server-pid "$4" --json "$OUT/$1.json" "${@:5}" | tee -a "$OUT/log.txt"
}
for r in $(seq "$ROUNDS"); do
  for build in "${BUILDS[@]}"; do
    bin=$EVMESH; [ "$build" = before ] && bin=$OUT/.before-bin
    dir=$(mktemp -d /var/tmp/evmesh-fanout.XXXX)
    # shellcheck disable=SC2086
    "$bin" serve --shards "$SHARDS" $EVMESH_FLAGS --data-dir "$dir" --listen 127.0.0.1:18180 --admin-listen 127.0.0.1:18181 > "$OUT/evmesh.log" 2>&1 &
    pid=$!
    wait_ready http://127.0.0.1:18181
    curl -sf 127.0.0.1:18180/events/subscribe -d '{"subscription":"fan","topic":"perf","mode":"BROADCAST"}' >/dev/null
    load "r$r-$build" "http://127.0.0.1:18180/events/publish?topic=perf" "ws://127.0.0.1:18180/events/ws?$EV_QUERY" "$pid" "${EV_ACK[@]}"
    # How many deliveries each write to a WebSocket session carried (the gathering).
    curl -sf 127.0.0.1:18181/metrics > "$OUT/r$r-$build.metrics" || true
    kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
  done
  [ "${NCHAN:-1}" = 0 ] || load "r$r-nchan" "http://127.0.0.1:18080/pub?id=fan_$r" "ws://127.0.0.1:18080/sub?id=fan_$r" "$NCHAN_PID"
done
python3 - "$OUT" "$ROUNDS" "$DUR" "$SUBS" "$RATE" "$SHARDS" "$MODE${EVMESH_FLAGS:+, $EVMESH_FLAGS}" "${BUILDS[*]}" <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, statistics as st
out, rounds, dur, subs, rate, shards, mode, builds = sys.argv[1:]
builds = builds.split()
print(f"### fan-out, {os.path.basename(out)}\n")
print(f"{subs} WebSocket subscribers of one topic, publishers at {rate}/s (8 connections, 1 KiB structured CloudEvent), "
      f"{dur}s per run after {int(subs) // 2000 + 2}s warm-up, {rounds} rounds in alternation; evmesh shards={shards} (BROADCAST, {mode}), nginx 1 worker.\n")
def gathered(path):
    m = {}
    for line in open(path):
        for k in ("evmesh_deliveries_total{", "evmesh_ws_writes_total{"):
            if line.startswith(k):
                m[k] = m.get(k, 0) + float(line.split()[-1])
    return m["evmesh_deliveries_total{"] / m["evmesh_ws_writes_total{"] if m.get("evmesh_ws_writes_total{") else None
print("| target | deliveries/s (median) | server CPU µs/delivery (median) | per round | e2e p50 / p99 / p99.9 / max µs (median) | subscribers connected | deliveries per write |")
print("|---|---|---|---|---|---|---|")
med = {}
for t in builds + ["nchan"]:
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r*-{t}.json"))]
    if not runs:
        continue
    f = [r["fanout"] for r in runs]
    cpu = [x["server_cpu_us_per_delivery"] for x in f if x["server_cpu_us_per_delivery"]]
    med[t] = st.median(cpu)
    lat = lambda k: int(st.median([x["e2e_latency_us"][k] for x in f]))
    print(f"| {t} | {int(st.median([x['deliveries_per_s'] for x in f]))} | {med[t]:.3f} | {', '.join(f'{v:.3f}' for v in cpu)} | "
          f"{lat('p50')} / {lat('p99')} / {lat('p999')} / {lat('max')} | {min(x['connected'] for x in f)}/{subs} | "
          + ", ".join(f"{g:.2f}" for g in map(gathered, sorted(glob.glob(f"{out}/r*-{t}.metrics"))) if g) + " |")
print()
for b in builds:
    if "nchan" not in med:
        break
    print(f"- {'evmesh' if b == 'evmesh' else 'evmesh ' + b} ({mode}): CPU per delivery = {med[b]/med['nchan']:.2f}x nchan's (issue 32's goal: <= 0.3x, at saturation with 100 subscribers and at 100,000 subscribers of one event a second)")
if builds == ["before", "after"]:
    print(f"- after / before: {med['after']/med['before']:.2f}x CPU per delivery")
PY
{ echo; echo "Command: \`${BEFORE:+BEFORE=$BEFORE }${NCHAN:+NCHAN=$NCHAN }ROUNDS=$ROUNDS DUR=$DUR SUBS=$SUBS RATE=$RATE SHARDS=$SHARDS ACK=$ACK EVMESH_FLAGS=\"$EVMESH_FLAGS\" bash perf/fanout.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
