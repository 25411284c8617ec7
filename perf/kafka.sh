#!/usr/bin/env bash
# Publishing through evmesh into the Kafka backend, beside the same broker driven by its own
# producer: tansu (Kafka API, memory storage, the peer from ../shared/peers) on :9092. Round by
# round, alternating: (1) loadgen posts 1 KiB structured CloudEvents to evmesh (storage = kafka,
# 1 shard, closed loop, CONNS connections), which produces each to Kafka and answers 202 after
# the broker's ack; (2) `tansu perf produce` writes 1 KiB records with CONNS producers, batch
# size 1. Reports throughput, evmesh's CPU per publish and the broker's CPU per record; appends
# a table to perf/RESULTS.md.
#
#   bash perf/kafka.sh        (ROUNDS=3 DUR=8 CONNS=64 env knobs)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-8}; CONNS=${CONNS:-64}
source perf/common.sh
TANSU=$P/tansu/tansu
if ! (exec 3<>/dev/tcp/127.0.0.1/9092) 2>/dev/null; then
  nohup "$TANSU" broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
    --storage-engine memory://tansu/ > "$P/tansu/tansu.log" 2>&1 &
  echo $! > "$P/tansu/tansu.pid"
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/9092) 2>/dev/null && break; sleep 0.1; done
fi
TP=$(pgrep -f "tansu broker --listener-url tcp://127.0.0.1:9092" | head -1)
OUT=$ROOT/perf/results/kafka-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
for r in $(seq "$ROUNDS"); do
  dir=$(mktemp -d /var/tmp/evmesh-kafka.XXXX)
  "$EVMESH" serve --shards 1 --data-dir "$dir" --listen 127.0.0.1:18380 --admin-listen 127.0.0.1:18381 \
    --storage kafka --kafka-brokers 127.0.0.1:9092 --kafka-topic-prefix "perf-$r-$$-" > "$OUT/evmesh.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18381
  curl -sf -X PUT 127.0.0.1:18381/admin/topics/k -d '{"partitions":1}' > /dev/null
  b0=$(ticks "$TP")
  "$LOADGEN" --url "http://127.0.0.1:18380/events/publish?topic=k" --connections "$CONNS" --duration "${DUR}s" \
    --warmup 0s --server-pid "$pid" --json "$OUT/r$r-evmesh.json" | tee -a "$OUT/log.txt"
  b1=$(ticks "$TP")
  echo "{\"broker_cpu_s\": $(( b1 - b0 ))e-2}" > "$OUT/r$r-evmesh-broker.json"
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
  topic="perf-direct-$r-$$"
  "$TANSU" topic create "$topic" --broker tcp://127.0.0.1:9092 --partitions 1 > /dev/null
  b0=$(ticks "$TP")
  timeout $(( DUR + 30 )) "$TANSU" perf "$topic" --broker tcp://127.0.0.1:9092 produce --batch-size 1 --record-size 1k \
    --producers "$CONNS" --duration "${DUR}s" > "$OUT/r$r-tansu.log" 2>&1 || true
  b1=$(ticks "$TP")
  n=$(timeout 150 "$P/venv/bin/python" "$P/tansu/count.py" "$topic" | sed -n 's/records: \([0-9]*\).*/\1/p')
  echo "{\"records\": ${n:-0}, \"broker_cpu_s\": $(( b1 - b0 ))e-2}" | tee "$OUT/r$r-tansu.json"
done
python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, statistics as st
out, rounds, dur, conns = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"### publish into Kafka (tansu, memory storage), {os.path.basename(out)}\n")
print(f"{rounds} rounds in alternation, {dur:.0f} s each, {conns} connections / producers, 1 KiB events, 1 partition; evmesh 1 shard.\n")
print("| path | throughput/s (median) | per round | evmesh CPU µs per publish | broker CPU µs per record |")
print("|---|---|---|---|---|")
ev = [json.load(open(f"{out}/r{r}-evmesh.json")) for r in range(1, rounds + 1)]
evb = [json.load(open(f"{out}/r{r}-evmesh-broker.json")) for r in range(1, rounds + 1)]
tp = [e["ok"] / e["duration_s"] for e in ev]
cpu = [e["server_cpu_us_per_op"] for e in ev]
bcpu = [b["broker_cpu_s"] * 1e6 / max(e["ok"], 1) for b, e in zip(evb, ev)]
print(f"| evmesh (HTTP -> Kafka, 202 after ack) | {st.median(tp):.0f} | {', '.join(f'{x:.0f}' for x in tp)} | {st.median(cpu):.1f} | {st.median(bcpu):.1f} |")
ta = [json.load(open(f"{out}/r{r}-tansu.json")) for r in range(1, rounds + 1)]
ttp = [t["records"] / dur for t in ta]
tb = [t["broker_cpu_s"] * 1e6 / max(t["records"], 1) for t in ta]
print(f"| tansu perf produce (direct) | {st.median(ttp):.0f} | {', '.join(f'{x:.0f}' for x in ttp)} | - | {st.median(tb):.1f} |")
print(f"\n- evmesh through Kafka reaches {st.median(tp) / max(st.median(ttp), 1):.2f}x the direct producer's throughput")
PY
{ echo; echo "Command: \`ROUNDS=$ROUNDS DUR=$DUR CONNS=$CONNS bash perf/kafka.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
