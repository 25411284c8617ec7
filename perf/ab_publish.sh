#!/usr/bin/env bash
# A/B of the publish hot path between two evmesh builds, beside nchan, in one run:
#
#   BEFORE=/path/to/old/evmesh bash perf/ab_publish.sh     (ROUNDS=3 DUR=10 CONNS=64 DRIVERS="epoll uring")
#
# AFTER defaults to this checkout's dist build (perf/common.sh). Each round runs every (build, driver) and
# nchan once, closed loop (max rate), in alternation, with both load generators the spec names:
# loadgen, then `wrk -t1 -c64` posting the same 1 KiB event (server CPU from /proc/PID/stat).
# The tables give the median server CPU µs per publish and throughput over rounds, and each
# build's ratio to nchan in the same run.
# Raw loadgen reports in perf/results/ab-publish-<stamp>/, the table is appended to RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-10}; CONNS=${CONNS:-64}; DRIVERS=${DRIVERS:-epoll uring}
: "${BEFORE:?BEFORE=path of the evmesh binary to compare against}"
source perf/common.sh
GIVEN_AFTER=${AFTER:-}
AFTER=${AFTER:-$EVMESH}
OUT=$ROOT/perf/results/ab-publish-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
cp "$BEFORE" "$OUT/.before-bin"; trap 'rm -f "$OUT/.before-bin" "$OUT/.post.lua"' EXIT
python3 - "$OUT/.post.lua" <<'PY'
import json, sys
event = {"specversion": "1.0", "id": "wrk", "source": "/perf", "type": "perf.event", "data": "x" * 900}
body = json.dumps(event)
open(sys.argv[1], "w").write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/cloudevents+json"\n'
                             f"wrk.body = {json.dumps(body)}\n")
PY

for r in $(seq "$ROUNDS"); do
  for build in before after; do
    bin=$AFTER; [ "$build" = before ] && bin=$OUT/.before-bin
    for drv in $DRIVERS; do
      dir=$(mktemp -d /var/tmp/evmesh-ab.XXXX)
      "$bin" serve --shards 1 --io-driver "$drv" --data-dir "$dir" --listen 127.0.0.1:18180 \
        --admin-listen 127.0.0.1:18181 > "$OUT/evmesh.log" 2>&1 &
      pid=$!
      wait_ready http://127.0.0.1:18181 || { cat "$OUT/evmesh.log" >&2; exit 1; }
      "$LOADGEN" --url "http://127.0.0.1:18180/events/publish?topic=perf" --connections "$CONNS" --duration "${DUR}s" \
        --warmup 1s --server-pid "$pid" --json "$OUT/r$r-$build-$drv.json" | tee -a "$OUT/log.txt"
      wrk_run "r$r-$build-$drv" "http://127.0.0.1:18180/events/publish?topic=perf" "$pid"
      kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
    done
  done
  "$LOADGEN" --url "http://127.0.0.1:18080/pub?id=ab_$r" --connections "$CONNS" --duration "${DUR}s" --warmup 1s \
    --server-pid "$NCHAN_PID" --json "$OUT/r$r-nchan.json" | tee -a "$OUT/log.txt"
  wrk_run "r$r-nchan" "http://127.0.0.1:18080/pub?id=ab_$r" "$NCHAN_PID"
done

python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" "$DRIVERS" <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, statistics as st
out, rounds, dur, conns, drivers = sys.argv[1:]
def runs(name, kind):
    return [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r*-{name}.{kind}"))]
def med(name, kind, key):
    return st.median(r[key] for r in runs(name, kind))
print(f"### publish A/B, {os.path.basename(out)}\n")
print(f"1 shard, durability os, {conns} keep-alive connections, closed loop, {dur}s per run after 1s warm-up, "
      f"{rounds} rounds in alternation; nchan (1 worker) in the same rounds. CPU is the server's, from /proc.\n")
for kind, label in [("json", "loadgen"), ("wrk.json", "wrk -t1")]:
    print(f"| {label}: build | driver | throughput (req/s, median) | server CPU µs/publish (median) | per round | / nchan |")
    print("|---|---|---|---|---|---|")
    nchan = med("nchan", kind, "server_cpu_us_per_op")
    for build in ["before", "after"]:
        for drv in drivers.split():
            name = f"{build}-{drv}"
            cpu = med(name, kind, "server_cpu_us_per_op")
            per = ", ".join(f"{r['server_cpu_us_per_op']:.2f}" for r in runs(name, kind))
            print(f"| {build} | {drv} | {med(name, kind, 'throughput'):.0f} | {cpu:.2f} | {per} | {cpu / nchan:.2f}x |")
    per = ", ".join(f"{r['server_cpu_us_per_op']:.2f}" for r in runs("nchan", kind))
    print(f"| nchan | - | {med('nchan', kind, 'throughput'):.0f} | {nchan:.2f} | {per} | 1.00x |\n")
PY
{ echo; echo "Command: \`${GIVEN_AFTER:+AFTER=$GIVEN_AFTER }BEFORE=$BEFORE ROUNDS=$ROUNDS DUR=$DUR CONNS=$CONNS DRIVERS=\"$DRIVERS\" bash perf/ab_publish.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
