#!/usr/bin/env bash
# Publishing through evmesh into the RocketMQ backend, beside the Kafka backend under the same
# load in the same run. Round by round, alternating: loadgen posts 1 KiB structured CloudEvents
# (closed loop, CONNS connections) to evmesh (1 shard, a topic of 1 partition) on
# (1) storage = rocketmq: a name server and broker of the run's own (scripts/rocketmq.sh, the
#     Rust implementation, async flush), the 202 after the broker's SEND_OK;
# (2) storage = kafka: tansu (memory storage) on a free port, the 202 after its ack.
# Reports throughput, latency, evmesh's CPU per publish and the broker's CPU per record; appends
# a table to perf/RESULTS.md.
#
#   bash perf/rocketmq.sh        (ROUNDS=3 DUR=8 CONNS=64 env knobs)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-8}; CONNS=${CONNS:-64}
export EVMESH_FEATURES=rocketmq
PEERS=0 source perf/common.sh
bash scripts/rocketmq.sh install
OUT=$ROOT/perf/results/rocketmq-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
RMQ=$(mktemp -d /var/tmp/evmesh-perf-rocketmq.XXXX)
NS=$(bash scripts/rocketmq.sh start "$RMQ")
RB=$(cat "$RMQ/broker.pid")
TANSU=${EVMESH_TANSU:-/var/tmp/evmesh-tansu/tansu}
KP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$TANSU" broker --listener-url "tcp://127.0.0.1:$KP" --advertised-listener-url "tcp://127.0.0.1:$KP" \
  --storage-engine memory://tansu/ > "$OUT/tansu.log" 2>&1 &
TP=$!
trap 'kill $TP 2>/dev/null || true; bash scripts/rocketmq.sh stop "$RMQ"; rm -rf "$RMQ"' EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$KP") 2>/dev/null && break; sleep 0.1; done
# one NAME BROKER_PID FLAGS...: one round of evmesh on a backend.
one() {
  local name=$1 bpid=$2; shift 2
  dir=$(mktemp -d /var/tmp/evmesh-perf.XXXX)
  "$EVMESH" serve --shards 1 --data-dir "$dir" --listen 127.0.0.1:18380 --admin-listen 127.0.0.1:18381 "$@" \
    > "$OUT/evmesh-$name.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18381
  curl -sf -X PUT 127.0.0.1:18381/admin/topics/k -d '{"partitions":1}' > /dev/null
  b0=$(ticks "$bpid")
  "$LOADGEN" --url "http://127.0.0.1:18380/events/publish?topic=k" --connections "$CONNS" --duration "${DUR}s" \
    --warmup 1s --server-pid "$pid" --json "$OUT/r$r-$name.json" | tee -a "$OUT/log.txt"
  b1=$(ticks "$bpid")
  echo "{\"broker_cpu_s\": $(( b1 - b0 ))e-2}" > "$OUT/r$r-$name-broker.json"
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
}
for r in $(seq "$ROUNDS"); do
  one rocketmq "$RB" --storage rocketmq --rocketmq-namesrv "$NS" --rocketmq-topic-prefix "perf-$r-$$-"
  one kafka "$TP" --storage kafka --kafka-brokers "127.0.0.1:$KP" --kafka-topic-prefix "perf-$r-$$-"
done
python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" <<'PY' | tee "$OUT/summary.md"
import json, sys, os, statistics as st
out, rounds, dur, conns = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"### publish into RocketMQ beside Kafka, {os.path.basename(out)}\n")
print(f"{rounds} rounds in alternation, {dur:.0f} s each, {conns} connections, 1 KiB events, 1 partition; evmesh 1 shard.\n")
print("| backend | throughput/s (median) | per round | p50 / p99 / p99.9 µs | evmesh CPU µs per publish | broker CPU µs per record |")
print("|---|---|---|---|---|---|")
med = {}
for name, label in [("rocketmq", "RocketMQ (rocketmq-rust 1.0 broker, async flush)"), ("kafka", "Kafka (tansu, memory)")]:
    ev = [json.load(open(f"{out}/r{r}-{name}.json")) for r in range(1, rounds + 1)]
    br = [json.load(open(f"{out}/r{r}-{name}-broker.json")) for r in range(1, rounds + 1)]
    tp = [e["ok"] / e["duration_s"] for e in ev]
    cpu = [e["server_cpu_us_per_op"] for e in ev]
    bcpu = [b["broker_cpu_s"] * 1e6 / max(e["ok"], 1) for b, e in zip(br, ev)]
    lat = [st.median(e["latency_us"][k] for e in ev) for k in ("p50", "p99", "p999")]
    errs = sum(e.get("errors", 0) for e in ev)
    med[name] = (st.median(tp), st.median(cpu))
    print(f"| {label} | {st.median(tp):.0f} | {', '.join(f'{x:.0f}' for x in tp)} | {' / '.join(f'{x:.0f}' for x in lat)} | {st.median(cpu):.1f} | {st.median(bcpu):.1f} |" + (f" ({errs} errors)" if errs else ""))
print(f"\n- evmesh CPU per publish, RocketMQ over Kafka: {med['rocketmq'][1] / med['kafka'][1]:.2f}x; throughput {med['rocketmq'][0] / med['kafka'][0]:.2f}x")
PY
{ echo; echo "Command: \`ROUNDS=$ROUNDS DUR=$DUR CONNS=$CONNS bash perf/rocketmq.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
