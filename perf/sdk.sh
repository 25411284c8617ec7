#!/usr/bin/env bash
# The Rust SDK against the raw protocol, beside each other in one run:
#
#   bash perf/sdk.sh      (ROUNDS=3 DUR=5 CONNS=4 PIPELINE=16 EVENTS=20000 WINDOW=256)
#
# Publish: loadgen's raw WebSocket publisher (--ws --pipeline) and evmesh-client's `Publisher`
# (examples/throughput.rs publish), CONNS connections x PIPELINE in flight each, 1 KiB
# structured events, closed loop. Consume with acks: EVENTS stored events drained by an SDK
# consumer (window WINDOW, an ack per delivery) and by a bare tokio-tungstenite WebSocket
# (attach with credit=WINDOW, an ack message per WINDOW/2 deliveries). 1 shard, io_uring,
# durability os; server CPU from /proc. Peers are not needed (the raw protocol is the
# reference). Appended to perf/RESULTS.md; raw results in perf/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-5}; CONNS=${CONNS:-4}; PIPELINE=${PIPELINE:-16}; EVENTS=${EVENTS:-20000}
WINDOW=${WINDOW:-256}
PEERS=0 source perf/common.sh
cargo build --release -q -p evmesh-client --examples
THROUGHPUT=$CARGO_TARGET_DIR/release/examples/throughput
OUT=$ROOT/perf/results/sdk-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
TCK=$(getconf CLK_TCK)
# measured NAME PID CMD...: runs CMD, writes $OUT/NAME.json = its JSON line + the server's CPU µs.
measured() {
  local name=$1 pid=$2 before after line; shift 2
  before=$(ticks "$pid"); line=$("$@"); after=$(ticks "$pid")
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["server_cpu_us"]=(int(sys.argv[3])-int(sys.argv[2]))*1e6/int(sys.argv[4]); print(json.dumps(r))' \
    "$line" "$before" "$after" "$TCK" > "$OUT/$name.json"
  cat "$OUT/$name.json" | tee -a "$OUT/log.txt"
}
start() {
  dir=$(mktemp -d /var/tmp/evmesh-sdk.XXXX)
  "$EVMESH" serve --shards 1 --io-driver uring --durability os --data-dir "$dir" --listen 127.0.0.1:18480 \
    --admin-listen 127.0.0.1:18481 > "$OUT/evmesh.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18481 || { cat "$OUT/evmesh.log" >&2; exit 1; }
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"; }
URL=http://127.0.0.1:18480
for r in $(seq "$ROUNDS"); do
  start
  # loadgen's numbers are its own report (throughput, server CPU per op).
  "$LOADGEN" --ws --pipeline "$PIPELINE" --url "$URL/events/ws?publish=perf" --connections "$CONNS" \
    --duration "${DUR}s" --warmup 1s --server-pid "$pid" --json "$OUT/r$r-raw-pub.loadgen.json" | tee -a "$OUT/log.txt"
  measured "r$r-sdk-pub" "$pid" "$THROUGHPUT" publish "$URL" perf "$DUR" "$CONNS" "$PIPELINE"
  for kind in sdk raw; do
    curl -sf "$URL/events/subscribe" -d "{\"subscription\":\"drain-$kind\",\"topic\":\"perf\",\"start\":\"earliest\"}" >/dev/null
  done
  mode() { [ "$1" = sdk ] && echo consume || echo consume-raw; }
  for kind in sdk raw; do
    measured "r$r-$kind-consume" "$pid" "$THROUGHPUT" "$(mode $kind)" "$URL" "drain-$kind" "$EVENTS" "$WINDOW"
  done
  stop
done
python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" "$PIPELINE" "$EVENTS" "$WINDOW" <<'PY' | tee "$OUT/summary.md" | tee -a perf/RESULTS.md
import json, sys, glob, os, statistics as st
out, rounds, dur, conns, pipeline, events, window = sys.argv[1:]
load = lambda pat: [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{pat}"))]
print(f"### evmesh-client against the raw protocol, {os.path.basename(out)}\n")
print(f"1 shard, io_uring, durability os, 1 KiB structured events, {rounds} rounds; publish: {conns} connections x "
      f"{pipeline} in flight, closed loop, {dur}s (loadgen after 1s warm-up); consume: {events} stored events "
      f"drained with acks, window {window}. CPU is the server's, from /proc. Command: `bash perf/sdk.sh`.\n")
print("| what | client | events/s (median) | per round | server CPU µs per event (median) | SDK / raw events/s |")
print("|---|---|---|---|---|---|")
raw = load("r*-raw-pub.loadgen.json"); sdk = load("r*-sdk-pub.json")
raw_rate = [r["throughput"] for r in raw]; raw_cpu = [r["server_cpu_us_per_op"] for r in raw]
sdk_rate = [r["events"] / r["seconds"] for r in sdk]; sdk_cpu = [r["server_cpu_us"] / r["events"] for r in sdk]
fmt = lambda xs: ", ".join("%.0f" % x for x in xs)
print(f"| publish | loadgen --ws --pipeline (raw) | {st.median(raw_rate):.0f} | {fmt(raw_rate)} | {st.median(raw_cpu):.2f} | |")
print(f"| publish | evmesh-client Publisher | {st.median(sdk_rate):.0f} | {fmt(sdk_rate)} | {st.median(sdk_cpu):.2f} | "
      f"{st.median(sdk_rate) / st.median(raw_rate):.2f}x |")
rates = {}
for kind, label in [("raw", "bare WebSocket (raw)"), ("sdk", "evmesh-client Consumer")]:
    rs = load(f"r*-{kind}-consume.json")
    rate = [r["events"] / r["seconds"] for r in rs]; cpu = [r["server_cpu_us"] / r["events"] for r in rs]
    rates[kind] = st.median(rate)
    ratio = f"{rates['sdk'] / rates['raw']:.2f}x" if kind == "sdk" else ""
    print(f"| consume + ack | {label} | {st.median(rate):.0f} | {fmt(rate)} | {st.median(cpu):.2f} | {ratio} |")
print()
PY
