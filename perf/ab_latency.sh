#!/usr/bin/env bash
# Open-loop latency A/B of two evmesh builds on both drivers, beside nginx's bare 200, at fixed
# rates, in one run:
#
#   BEFORE=/path/to/old/evmesh bash perf/ab_latency.sh   (AFTER= this checkout's dist build;
#                                                         ROUNDS=4 DUR=5 RATES="31000 62000")
#
# Each round runs nginx, then each build on epoll and io_uring (one shard on CPU 0), at every
# rate, loadgen on CPU 1 (64 connections, 2 threads, latencies corrected for coordinated
# omission). The table gives each target's medians over rounds (and every round's p99, since
# one noisy round on this shared machine can move a median of four).
# Raw loadgen reports (one JSON line per run) in perf/results/ab-latency-<stamp>/runs.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-4}; DUR=${DUR:-5}; RATES=${RATES:-31000 62000}; SHARDS=1
source perf/common.sh
AFTER=${AFTER:-$EVMESH}
taskset -pc 0 "$NCHAN_PID" > /dev/null
OUT=$ROOT/perf/results/ab-latency-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
LOG=$OUT/runs.jsonl

# one URL PID NAME RATE: one open-loop run, its report appended to runs.jsonl.
one() {
  taskset -c 1 "$LOADGEN" --url "$1" --connections 64 --threads 2 --rate "$4" --duration "${DUR}s" --warmup 1s \
    --server-pid "$2" --json "$OUT/one.json" > /dev/null
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); j.update(name=sys.argv[2], rate=int(sys.argv[3])); print(json.dumps(j))" \
    "$OUT/one.json" "$3" "$4" >> "$LOG"
}

for r in $(seq "$ROUNDS"); do
  for rate in $RATES; do one http://127.0.0.1:18080/ok_post "$NCHAN_PID" nginx "$rate"; done
  for build in before after; do
    bin=$BEFORE; [ "$build" = after ] && bin=$AFTER
    for d in epoll uring; do
      start_evmesh "$d" os "$bin"
      for rate in $RATES; do one "http://127.0.0.1:18180/events/publish?topic=perf" "$EV_PID" "$build-$d" "$rate"; done
      stop_evmesh
    done
  done
done
rm -f "$OUT/one.json"

python3 - "$LOG" "$ROUNDS" "$DUR" <<'PY' | tee "$OUT/summary.md"
import collections, json, os, statistics as st, sys
log, rounds, dur = sys.argv[1], sys.argv[2], sys.argv[3]
runs = collections.defaultdict(list)
for line in open(log):
    j = json.loads(line)
    runs[(j["rate"], j["name"])].append(j)
print(f"### latency A/B, {os.path.basename(os.path.dirname(log))}\n")
print(f"{rounds} rounds of {dur}s per target and rate, open loop, 64 connections, 1 KiB structured event, server on CPU 0.\n")
print("| rate (req/s) | target | p50 / p99 / p99.9 µs (median) | p99 per round | CPU µs per publish | p99 / nginx's |")
print("|---|---|---|---|---|---|")
for rate in sorted({k[0] for k in runs}):
    med = lambda name, k: st.median(x["latency_us"][k] for x in runs[(rate, name)])
    for name in sorted({k[1] for k in runs if k[0] == rate}):
        rs = runs[(rate, name)]
        print(f"| {rate} | {name} | {med(name, 'p50'):.0f} / {med(name, 'p99'):.0f} / {med(name, 'p999'):.0f} | "
              f"{', '.join(str(x['latency_us']['p99']) for x in rs)} | {st.median(x['server_cpu_us_per_op'] for x in rs):.2f} | "
              f"{med(name, 'p99') / med('nginx', 'p99'):.2f}x |")
PY
{ echo; echo "Command: \`${AFTER:+AFTER=$AFTER }BEFORE=$BEFORE ROUNDS=$ROUNDS DUR=$DUR RATES=\"$RATES\" bash perf/ab_latency.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
