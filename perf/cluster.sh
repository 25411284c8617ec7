#!/usr/bin/env bash
# Takeover under load (issue "Many instances", SPEC "Many instances"): three evmesh instances
# over one Kafka-protocol broker (tansu, memory storage, on a free port), heartbeat and timeout
# at their defaults (1000 / 3000 ms). perf/cluster.py publishes RATE events/s round robin over
# them, one consumer follows recommend and acks everything, and after WARM s the subscription's
# home is killed with kill -9. Per run: seconds from the kill to the first event the new home
# delivers, events lost (answered 202, never delivered: must be 0), deliveries twice, and how
# many of those the old home had in flight. RUNS runs, each with fresh instances; the table is
# appended to perf/RESULTS.md, the raw lines kept in perf/results/cluster-<stamp>/.
#
#   bash perf/cluster.sh        (RUNS=5 RATE=500 WARM=5 AFTER=5 env knobs)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}; export RATE=${RATE:-500} WARM=${WARM:-5} AFTER=${AFTER:-5}
PEERS=0 source perf/common.sh
OUT=$ROOT/perf/results/cluster-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
source perf/cluster_common.sh
for r in $(seq "$RUNS"); do
  start_three "run$r-$$-" "$OUT/r$r"
  (IFS=,; "$VENV/bin/python" perf/cluster.py "${urls[*]}" "${pids[*]}" "${admins[*]}") | tee "$OUT/r$r.json"
  stop_three
done
python3 - "$OUT" "$RUNS" <<'PY' | tee "$OUT/summary.md"
import json, os, statistics as st, sys
out, runs = sys.argv[1], int(sys.argv[2])
rs = [json.loads(open(f"{out}/r{r}.json").read()) for r in range(1, runs + 1)]
r0 = rs[0]
print(f"### takeover after kill -9 under load, {os.path.basename(out)}\n")
print(f"`RUNS={runs} RATE={r0['rate']:.0f} bash perf/cluster.sh`: 3 instances (1 shard each) over tansu, "
      "heartbeat_ms 1000, instance_timeout_ms 3000 (defaults), one LOAD_BALANCE consumer acking each event, "
      "the home killed after 5 s of load (the Python publisher reaches what the per-s column says of the target rate).\n")
print("| run | kill -> first delivery at the new home (s) | published (202) | per s | lost | delivered twice | of which the old home had in flight | publishes unanswered at the kill |")
print("|---|---|---|---|---|---|---|---|")
for i, r in enumerate(rs, 1):
    t = "never" if r["takeover_s"] is None else f"{r['takeover_s']:.2f}"
    print(f"| {i} | {t} | {r['published']} | {r['published_per_s']} | {r['lost']} | {r['duplicates']} | {r['redelivered_from_old_home']} | {r['unknown']} |")
ts = [r["takeover_s"] for r in rs if r["takeover_s"] is not None]
if ts:
    print(f"\nMedian takeover {st.median(ts):.2f} s (goal: under 5 s); lost in all runs: {sum(r['lost'] for r in rs)}.")
PY
cat "$OUT/summary.md" >> perf/RESULTS.md
