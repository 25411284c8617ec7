#!/usr/bin/env bash
# Read amplification with several instances over one Kafka-protocol broker (issue "Many
# instances", item 6): 3 instances (1 shard each) over tansu (memory storage, a free port),
# TOPICS topics with one LOAD_BALANCE subscription and consumer each (at its home), EVENTS 1 KiB
# events per topic published round robin over the instances. perf/amplification.py reports per
# instance the bytes its Kafka tail read over the bytes all instances wrote. RUNS runs, each
# with fresh instances; the table is appended to perf/RESULTS.md, the raw lines kept in
# perf/results/amplification-<stamp>/.
#
#   bash perf/amplification.sh        (RUNS=3 TOPICS=30 EVENTS=200 env knobs)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}; export TOPICS=${TOPICS:-30} EVENTS=${EVENTS:-200}
PEERS=0 source perf/common.sh
VENV=/var/tmp/evmesh-venv; TANSU=/var/tmp/evmesh-tansu/tansu
[ -x "$TANSU" ] && "$VENV/bin/python" -c 'import websockets, httpx' 2>/dev/null ||
  { echo "run scripts/test.sh once first: it installs tansu and the Python packages this uses" >&2; exit 1; }
OUT=$ROOT/perf/results/amplification-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
KP=$(free_port)
"$TANSU" broker --listener-url "tcp://127.0.0.1:$KP" --advertised-listener-url "tcp://127.0.0.1:$KP" \
  --storage-engine memory://tansu/ > /dev/null 2>&1 &
TP=$!
pids=(); dirs=()
cleanup() { kill "${pids[@]}" "$TP" 2>/dev/null || true; rm -rf "${dirs[@]}"; }
trap cleanup EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$KP") 2>/dev/null && break; sleep 0.1; done
for r in $(seq "$RUNS"); do
  pids=(); urls=(); admins=()
  for i in 1 2 3; do
    port=$(free_port); aport=$(free_port); dir=$(mktemp -d /var/tmp/evmesh-amp.XXXX); dirs+=("$dir")
    "$EVMESH" serve --shards 1 --data-dir "$dir" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$aport" \
      --storage kafka --kafka-brokers "127.0.0.1:$KP" --kafka-topic-prefix "amp$r-$$-" > /dev/null 2>&1 &
    pids+=($!); urls+=("http://127.0.0.1:$port"); admins+=("http://127.0.0.1:$aport")
  done
  for a in "${admins[@]}"; do
    wait_ready "$a"
    for _ in $(seq 200); do
      [ "$(curl -sf "$a/admin/cluster" | "$VENV/bin/python" -c 'import json,sys; v=json.load(sys.stdin); print(len(v["instances"]), v.get("claimsRead"))')" = "3 True" ] && break
      sleep 0.1
    done
  done
  (IFS=,; "$VENV/bin/python" perf/amplification.py "${urls[*]}" "${admins[*]}" "${pids[*]}") | tee "$OUT/r$r.json"
  kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true
  rm -rf "${dirs[@]}"; dirs=()
done
python3 - "$OUT" "$RUNS" "$(git rev-parse --short HEAD)" <<'PY' | tee "$OUT/summary.md"
import json, os, sys
out, runs, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rs = [json.loads(open(f"{out}/r{r}.json").read()) for r in range(1, runs + 1)]
print(f"### read amplification, 3 instances over tansu, {os.path.basename(out)} (at {rev})\n")
print(f"`RUNS={runs} TOPICS={rs[0]['topics']} EVENTS={rs[0]['events_per_topic']} bash perf/amplification.sh`: "
      "one LOAD_BALANCE subscription and consumer per topic, at its home; 1 KiB events published round robin. "
      "Per instance: topics homed there / bytes its Kafka tail read (`evmesh_kafka_tail_bytes_total`) over the "
      "bytes all instances wrote. Last column: bytes over loopback during the run over bytes written (Kafka "
      "produce and fetch, publishes, deliveries and acks; any build).\n")
print("| run | instance 1 | instance 2 | instance 3 | tail sum | loopback |")
print("|---|---|---|---|---|---|")
for i, r in enumerate(rs, 1):
    xs = r["instances"]
    cells = [f"{x['topics_homed']} / {x['read_per_written']:.2f}" for x in xs]
    tail = sum(x["read_per_written"] for x in xs)
    print(f"| {i} | " + " | ".join(cells) + f" | {tail:.2f} | {r['loopback_per_written']:.2f} |")
PY
cat "$OUT/summary.md" >> perf/RESULTS.md
