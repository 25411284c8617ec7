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
OUT=$ROOT/perf/results/amplification-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
source perf/cluster_common.sh
for r in $(seq "$RUNS"); do
  start_three "amp$r-$$-"
  (IFS=,; "$VENV/bin/python" perf/amplification.py "${urls[*]}" "${admins[*]}" "${pids[*]}") | tee "$OUT/r$r.json"
  stop_three
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
