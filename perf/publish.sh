#!/usr/bin/env bash
# Publish benchmark: evmesh beside nginx+nchan, the same loadgen load, in alternation, several rounds.
#
#   bash perf/publish.sh            (ROUNDS=3 DUR=10 CONNS=64 SHARDS=1 env knobs; TARGETS= picks
#                                    targets; BEFORE=/path/to/old/evmesh adds that build as the
#                                    targets before-uring-os and before-epoll-os; a target ending
#                                    in -direct, such as evmesh-uring-os-direct, runs with
#                                    --direct-io true)
#
# Per round and target: a closed-loop run (max rate) with --server-pid, then open-loop runs at
# half of that target's max rate and at a fixed LOW_RATE (p50/p99 coordinated-omission
# corrected). Targets: evmesh epoll/os, evmesh uring/os, evmesh epoll/fsync, nchan /pub, and
# nginx's bare `return 200` for the same POST (the loopback HTTP ceiling). evmesh runs
# with SHARDS=1 so it gets the same one core as the single nginx worker; loadgen uses the other.
# Pinned: evmesh's shard sits on CPU 0 (it pins itself), the nginx worker is pinned there too,
# and loadgen runs under `taskset -c $GEN_CPUS` (default: every CPU but 0); the open-loop runs
# use two generator threads, and the table shows the rate each held.
# Raw JSON reports land in perf/results/<stamp>/, a markdown table is printed and appended to
# perf/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-10}; CONNS=${CONNS:-64}; SHARDS=${SHARDS:-1}; LOW_RATE=${LOW_RATE:-5000}
source perf/common.sh
GEN_CPUS=${GEN_CPUS:-1-$(( $(nproc) - 1 ))}
taskset -pc 0 "$NCHAN_PID" > /dev/null
OUT=$ROOT/perf/results/publish-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"

TARGETS=${TARGETS:-"evmesh-epoll-os nchan evmesh-uring-os nginx-200 evmesh-epoll-fsync${BEFORE:+ before-uring-os before-epoll-os}"}
run() { # name url pid
  local name=$1 url=$2 pid=$3 max half
  taskset -c "$GEN_CPUS" "$LOADGEN" --url "$url" --connections "$CONNS" --duration "${DUR}s" --warmup 1s --server-pid "$pid" --json "$OUT/$name.closed.json" | tee -a "$OUT/log.txt"
  max=$(python3 -c "import json;print(int(json.load(open('$OUT/$name.closed.json'))['throughput']))")
  half=$((max / 2))
  taskset -c "$GEN_CPUS" "$LOADGEN" --url "$url" --connections "$CONNS" --threads 2 --duration "${DUR}s" --warmup 1s --rate "$half" --server-pid "$pid" --json "$OUT/$name.open.json" | tee -a "$OUT/log.txt"
  taskset -c "$GEN_CPUS" "$LOADGEN" --url "$url" --connections "$CONNS" --threads 2 --duration "${DUR}s" --warmup 1s --rate "$LOW_RATE" --server-pid "$pid" --json "$OUT/$name.low.json" | tee -a "$OUT/log.txt"
}

for r in $(seq "$ROUNDS"); do
  for target in $TARGETS; do
    case $target in
      nchan) run "r$r-nchan" "http://127.0.0.1:18080/pub?id=perf_$r" "$NCHAN_PID" ;;
      nginx-200) run "r$r-nginx-200" "http://127.0.0.1:18080/ok_post" "$NCHAN_PID" ;;
      evmesh-* | before-*)
        IFS=- read -r which drv dur extra <<< "$target"
        bin=$EVMESH; [ "$which" = before ] && bin=$BEFORE
        flags=(); [ "$extra" = direct ] && flags=(--direct-io true)
        start_evmesh "$drv" "$dur" "$bin" "${flags[@]}"
        run "r$r-$target" "http://127.0.0.1:18180/events/publish?topic=perf" "$EV_PID"
        stop_evmesh ;;
    esac
  done
done

python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" "$SHARDS" "$LOW_RATE" <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, statistics as st, platform, subprocess
out, rounds, dur, conns, shards, low = sys.argv[1:]
targets = ["evmesh-epoll-os", "evmesh-uring-os", "evmesh-uring-os-direct", "evmesh-epoll-fsync", "before-epoll-os", "before-uring-os", "nchan", "nginx-200"]
def load(t, kind):
    return [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r*-{t}.{kind}.json"))]
cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip()
print(f"### publish, {os.path.basename(out)}\n")
print(f"Machine: {cpu}, {os.cpu_count()} CPUs, kernel {platform.release()}. loadgen pinned away from CPU 0 (the shard's and the nginx worker's), 1 thread closed loop and 2 threads open loop, {conns} keep-alive connections, "
      f"1 KiB structured CloudEvent, {dur}s per run after 1s warm-up, {rounds} rounds in alternation; evmesh shards={shards}, nginx 1 worker.\n")
print(f"| target | max rate (req/s, median) | server CPU µs/request (median of rounds) | CPU µs per round | half max: rate held (req/s) | p50 / p99 / p99.9 µs at half max rate (median) | p50 / p99 / p99.9 µs at {low}/s (median) | errors |")
print("|---|---|---|---|---|---|---|---|")
med = {}
for t in targets:
    c, o, lo = load(t, "closed"), load(t, "open"), load(t, "low")
    if not c: continue
    cpus = [x["server_cpu_us_per_op"] for x in c if x["server_cpu_us_per_op"]]
    med[t] = st.median(cpus) if cpus else None
    lat = lambda runs, k: int(st.median([x["latency_us"][k] for x in runs]))
    errs = sum(x["errors"] + x["connect_errors"] for x in c + o + lo)
    print(f"| {t} | {int(st.median([x['throughput'] for x in c]))} | {med[t]:.2f} | {', '.join(f'{v:.2f}' for v in cpus)} | "
          f"{int(st.median([x['throughput'] for x in o]))} | {lat(o, 'p50')} / {lat(o, 'p99')} / {lat(o, 'p999')} | {lat(lo, 'p50')} / {lat(lo, 'p99')} / {lat(lo, 'p999')} | {errs} |")
if med.get("nchan"):
    print()
    for t in targets[:6]:
        if med.get(t): print(f"- {t}: CPU per publish = {med[t]/med['nchan']:.2f}x nchan's, {med[t]/med['nginx-200']:.2f}x nginx's bare 200")
    print(f"- nchan: {med['nchan']/med['nginx-200']:.2f}x nginx's bare 200")
PY
{ echo; echo "Command: \`${BEFORE:+BEFORE=$BEFORE }ROUNDS=$ROUNDS DUR=$DUR CONNS=$CONNS SHARDS=$SHARDS LOW_RATE=$LOW_RATE bash perf/publish.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
