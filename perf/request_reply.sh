#!/usr/bin/env bash
# Request-reply round trip: requesters POST /events/request (1 KiB structured CloudEvent, open
# loop at RATE/s over 64 connections) to a topic whose LOAD_BALANCE subscription RESPONDERS
# WebSocket sessions serve (each request answered with a reply frame and acked, by loadgen
# --reply); beside it, the same requests POSTed straight to an HTTP responder that answers with
# the same reply event (loadgen --serve): the broker taken out. Both in alternation over ROUNDS,
# the broker pinned to core 0 and loadgen to core 1. Reports p50/p99/p99.9 of each, what the
# broker adds at p50, and the broker's CPU-µs per round trip; appends a table to perf/RESULTS.md.
#
#   bash perf/request_reply.sh     (ROUNDS=3 DUR=8 RATES="1000 5000" RESPONDERS=4 SHARDS=1)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-8}; RATES=${RATES:-1000 5000}; RESPONDERS=${RESPONDERS:-4}; SHARDS=${SHARDS:-1}
PEERS=0 source perf/common.sh
OUT=$ROOT/perf/results/request-reply-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
load() { # name url pid rate [loadgen flags]
  taskset -c 1 "$LOADGEN" --url "$2" --connections 64 --duration "${DUR}s" --warmup 2s --rate "$4" \
    --server-pid "$3" --json "$OUT/$1.json" "${@:5}" | tee -a "$OUT/log.txt"
}
for rate in $RATES; do
  for r in $(seq "$ROUNDS"); do
    dir=$(mktemp -d /var/tmp/evmesh-rr.XXXX)
    taskset -c 0 "$EVMESH" serve --shards "$SHARDS" --data-dir "$dir" --listen 127.0.0.1:18180 \
      --admin-listen 127.0.0.1:18181 > "$OUT/evmesh.log" 2>&1 &
    pid=$!
    wait_ready http://127.0.0.1:18181
    curl -sf 127.0.0.1:18180/events/subscribe \
      -d '{"subscription":"responders","topic":"rpc","mode":"LOAD_BALANCE"}' >/dev/null
    load "$rate-r$r-evmesh" "http://127.0.0.1:18180/events/request?topic=rpc&timeoutMs=5000" "$pid" "$rate" \
      --subscribe-url "ws://127.0.0.1:18180/events/ws?subscription=responders" --subscribers "$RESPONDERS" --reply
    # The one-way leg for reference: the same events published (202 once stored) and delivered
    # to the same responders, which ack them.
    load "$rate-r$r-oneway" "http://127.0.0.1:18180/events/publish?topic=rpc" "$pid" "$rate" \
      --subscribe-url "ws://127.0.0.1:18180/events/ws?subscription=responders" --subscribers "$RESPONDERS" --ack
    kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
    taskset -c 0 "$LOADGEN" --serve 127.0.0.1:18190 &
    direct=$!
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/18190) 2>/dev/null && break; sleep 0.1; done
    load "$rate-r$r-direct" "http://127.0.0.1:18190/direct" "$direct" "$rate"
    kill "$direct"; wait "$direct" 2>/dev/null || true
    sleep 0.5 # the ports are free again before the next round binds them
  done
done
python3 - "$OUT" "$ROUNDS" "$DUR" "$RESPONDERS" "$SHARDS" $RATES <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, statistics as st
out, rounds, dur, responders, shards, *rates = sys.argv[1:]
print(f"### request-reply, {os.path.basename(out)}\n")
print(f"Requests of 1 KiB (structured CloudEvent) at a fixed rate over 64 keep-alive connections (open loop, "
      f"coordinated omission corrected), {dur}s per run after 2s warm-up, {rounds} rounds in alternation. Through "
      f"evmesh (shards={shards}, durability os): a LOAD_BALANCE subscription served by {responders} WebSocket "
      f"responders that answer with a reply frame and ack. Direct: the same requests POSTed to an HTTP responder "
      f"answering with the same reply event. Broker on core 0, loadgen on core 1.\n")
print("| rate/s | path | ok/s (median) | p50 / p99 / p99.9 µs (median) | errors | server CPU µs per round trip (median; per round) |")
print("|---|---|---|---|---|---|")
for rate in rates:
    med = {}
    for t in ["evmesh", "oneway", "direct"]:
        runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{rate}-r*-{t}.json"))]
        lat = lambda k: int(st.median([x["latency_us"][k] for x in runs]))
        cpu = [x["server_cpu_us_per_op"] for x in runs if x["server_cpu_us_per_op"]]
        med[t] = lat("p50")
        name = {"evmesh": "evmesh request-reply", "oneway": "evmesh publish + acked delivery (one way, for reference)", "direct": "direct"}[t]
        extra = ""
        if t == "oneway":
            extra = f" (delivery p50 {int(st.median([x['fanout']['e2e_latency_us']['p50'] for x in runs]))})"
        print(f"| {rate} | {name} | {int(st.median([x['throughput'] for x in runs]))} | {lat('p50')} / {lat('p99')} / {lat('p999')}{extra} | "
              f"{sum(x['errors'] + x['connect_errors'] for x in runs)} | {st.median(cpu):.1f} ({', '.join(f'{v:.1f}' for v in cpu)}) |")
    print(f"| {rate} | **added by the broker at p50** | | **{med['evmesh'] - med['direct']} µs** (target <= 100) | | |")
PY
{ echo; echo "Command: \`ROUNDS=$ROUNDS DUR=$DUR RATES=\"$RATES\" RESPONDERS=$RESPONDERS SHARDS=$SHARDS bash perf/request_reply.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
