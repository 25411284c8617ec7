#!/usr/bin/env bash
# Issue 32's tail-latency table: open-loop publishes at 25%, 50% and 80% of evmesh's maximum
# rate, on both I/O drivers, beside nginx's bare `return 200` at the same rates.
#
#   bash perf/tail_latency.sh      (ROUNDS=3 DUR=8 CONNS=64 FRACTIONS="25 50 80";
#                                   EVMESH_BIN= picks the build; BEFORE=/path/to/old/evmesh
#                                   adds that build on io_uring as the target before-uring)
#
# Per round: evmesh (epoll, one shard on CPU 0) closed loop gives the maximum rate; then each
# target (evmesh epoll, evmesh io_uring, nginx-200, pinned to CPU 0) takes an open-loop run at
# each fraction of that rate, loadgen on the other CPUs (two threads, latencies corrected for
# coordinated omission: measured from when each request was due). The table gives medians of
# the rounds' p50 / p99 / p99.9 and the rate each target held. `--io-driver auto` is io_uring
# where the kernel allows it (src/runtime); the table says whether that is the driver that wins.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-8}; CONNS=${CONNS:-64}; FRACTIONS=${FRACTIONS:-25 50 80}; SHARDS=1
source perf/common.sh
GEN_CPUS=${GEN_CPUS:-1-$(( $(nproc) - 1 ))}
taskset -pc 0 "$NCHAN_PID" > /dev/null
OUT=$ROOT/perf/results/tail-latency-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
EVURL="http://127.0.0.1:18180/events/publish?topic=perf"

# open_run NAME URL PID RATE: one open-loop run.
open_run() {
  taskset -c "$GEN_CPUS" "$LOADGEN" --url "$2" --connections "$CONNS" --threads 2 --duration "${DUR}s" --warmup 1s \
    --rate "$4" --server-pid "$3" --json "$OUT/$1.json" | tee -a "$OUT/log.txt"
}

for r in $(seq "$ROUNDS"); do
  start_evmesh epoll os
  taskset -c "$GEN_CPUS" "$LOADGEN" --url "$EVURL" --connections "$CONNS" --duration "${DUR}s" --warmup 1s \
    --server-pid "$EV_PID" --json "$OUT/r$r-max.json" | tee -a "$OUT/log.txt"
  max=$(python3 -c "import json;print(int(json.load(open('$OUT/r$r-max.json'))['throughput']))")
  for f in $FRACTIONS; do open_run "r$r-evmesh-epoll-$f" "$EVURL" "$EV_PID" $((max * f / 100)); done
  stop_evmesh
  start_evmesh uring os
  for f in $FRACTIONS; do open_run "r$r-evmesh-uring-$f" "$EVURL" "$EV_PID" $((max * f / 100)); done
  stop_evmesh
  if [ -n "${BEFORE:-}" ]; then
    start_evmesh uring os "$BEFORE"
    for f in $FRACTIONS; do open_run "r$r-before-uring-$f" "$EVURL" "$EV_PID" $((max * f / 100)); done
    stop_evmesh
  fi
  for f in $FRACTIONS; do open_run "r$r-nginx-200-$f" "http://127.0.0.1:18080/ok_post" "$NCHAN_PID" $((max * f / 100)); done
done

python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" "$FRACTIONS" <<'PY' | tee "$OUT/summary.md"
import glob, json, os, platform, statistics as st, sys
out, rounds, dur, conns, fractions = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5].split()
cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip()
maxes = [json.load(open(f))["throughput"] for f in sorted(glob.glob(f"{out}/r*-max.json"))]
print(f"### tail latency, {os.path.basename(out)}\n")
print(f"Machine: {cpu}, {os.cpu_count()} CPUs, kernel {platform.release()}. One evmesh shard or one nginx worker on CPU 0, "
      f"loadgen (2 threads, open loop, coordinated omission corrected) on the others, {conns} keep-alive connections, "
      f"1 KiB structured CloudEvent, {dur}s per run after 1s warm-up, {rounds} rounds. evmesh's maximum rate (epoll, closed "
      f"loop) per round: {', '.join(str(int(m)) for m in maxes)} req/s.\n")
print("| rate | target | rate held (req/s) | p50 / p99 / p99.9 µs (median of rounds) | p99 / nginx's | p99.9 / nginx's | errors |")
print("|---|---|---|---|---|---|---|")
for f in fractions:
    targets = ["evmesh-epoll", "evmesh-uring", "before-uring", "nginx-200"]
    runs = {t: [json.load(open(p)) for p in sorted(glob.glob(f"{out}/r*-{t}-{f}.json"))] for t in targets}
    runs = {t: rs for t, rs in runs.items() if rs}
    med = {t: {k: st.median([x["latency_us"][k] for x in rs]) for k in ["p50", "p99", "p999"]} for t, rs in runs.items()}
    for t, rs in runs.items():
        m = med[t]
        print(f"| {f}% | {t} | {int(st.median([x['throughput'] for x in rs]))} | {int(m['p50'])} / {int(m['p99'])} / {int(m['p999'])} | "
              f"{m['p99'] / med['nginx-200']['p99']:.2f}x | {m['p999'] / med['nginx-200']['p999']:.2f}x | {sum(x['errors'] + x['connect_errors'] for x in rs)} |")
PY
{ echo; echo "Command: \`${EVMESH_BIN:+EVMESH_BIN=$EVMESH_BIN }${BEFORE:+BEFORE=$BEFORE }ROUNDS=$ROUNDS DUR=$DUR CONNS=$CONNS FRACTIONS=\"$FRACTIONS\" bash perf/tail_latency.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
