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
VENV=/var/tmp/evmesh-venv; TANSU=/var/tmp/evmesh-tansu/tansu
[ -x "$TANSU" ] && "$VENV/bin/python" -c 'import websockets, httpx' 2>/dev/null ||
  { echo "run scripts/test.sh once first: it installs tansu and the Python packages this uses" >&2; exit 1; }
OUT=$ROOT/perf/results/cluster-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
KP=$(free_port)
"$TANSU" broker --listener-url "tcp://127.0.0.1:$KP" --advertised-listener-url "tcp://127.0.0.1:$KP" \
  --storage-engine memory://tansu/ > "$OUT/tansu.log" 2>&1 &
TP=$!
pids=(); dirs=()
cleanup() { kill "${pids[@]}" "$TP" 2>/dev/null || true; rm -rf "${dirs[@]}"; }
trap cleanup EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$KP") 2>/dev/null && break; sleep 0.1; done
for r in $(seq "$RUNS"); do
  pids=(); urls=(); admins=()
  for i in 1 2 3; do
    port=$(free_port); aport=$(free_port); dir=$(mktemp -d /var/tmp/evmesh-cluster.XXXX); dirs+=("$dir")
    "$EVMESH" serve --shards 1 --data-dir "$dir" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$aport" \
      --storage kafka --kafka-brokers "127.0.0.1:$KP" --kafka-topic-prefix "run$r-$$-" > "$OUT/r$r-i$i.log" 2>&1 &
    pids+=($!); urls+=("http://127.0.0.1:$port"); admins+=("http://127.0.0.1:$aport")
  done
  for a in "${admins[@]}"; do
    wait_ready "$a"
    for _ in $(seq 200); do
      [ "$(curl -sf "$a/admin/cluster" | "$VENV/bin/python" -c 'import json,sys; print(len(json.load(sys.stdin)["instances"]))')" = 3 ] && break
      sleep 0.1
    done
  done
  (IFS=,; "$VENV/bin/python" perf/cluster.py "${urls[*]}" "${pids[*]}" "${admins[*]}") | tee "$OUT/r$r.json"
  kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true
  rm -rf "${dirs[@]}"; dirs=()
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
