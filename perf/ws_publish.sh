#!/usr/bin/env bash
# Publishing over WebSocket (GET /events/ws?publish=T) beside keep-alive HTTP publishing and
# nchan's HTTP publish, in one run:
#
#   bash perf/ws_publish.sh      (ROUNDS=3 DUR=5 CONNS=64 PIPELINE=16)
#
# Per round, in alternation: evmesh HTTP (CONNS connections, one request in flight each),
# evmesh WebSocket with one message in flight per connection (CONNS), evmesh WebSocket with
# PIPELINE messages in flight (CONNS/4 connections), nchan HTTP (CONNS). 1 shard, io_uring,
# durability os, 1 KiB structured event; server CPU per event from /proc. Appended to
# perf/RESULTS.md; raw reports in perf/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-5}; CONNS=${CONNS:-64}; PIPELINE=${PIPELINE:-16}
source perf/common.sh
OUT=$ROOT/perf/results/ws-publish-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
for r in $(seq "$ROUNDS"); do
  dir=$(mktemp -d /var/tmp/evmesh-wsp.XXXX)
  "$EVMESH" serve --shards 1 --io-driver uring --data-dir "$dir" --listen 127.0.0.1:18380 \
    --admin-listen 127.0.0.1:18381 > "$OUT/evmesh.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18381 || { cat "$OUT/evmesh.log" >&2; exit 1; }
  "$LOADGEN" --url "http://127.0.0.1:18380/events/publish?topic=perf" --connections "$CONNS" --duration "${DUR}s" \
    --warmup 1s --server-pid "$pid" --json "$OUT/r$r-http.json" | tee -a "$OUT/log.txt"
  "$LOADGEN" --ws --url "http://127.0.0.1:18380/events/ws?publish=perf" --connections "$CONNS" --duration "${DUR}s" \
    --warmup 1s --server-pid "$pid" --json "$OUT/r$r-ws1.json" | tee -a "$OUT/log.txt"
  "$LOADGEN" --ws --pipeline "$PIPELINE" --url "http://127.0.0.1:18380/events/ws?publish=perf" \
    --connections $(( CONNS / 4 )) --duration "${DUR}s" --warmup 1s --server-pid "$pid" --json "$OUT/r$r-wsp.json" \
    | tee -a "$OUT/log.txt"
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
  "$LOADGEN" --url "http://127.0.0.1:18080/pub?id=wsp_$r" --connections "$CONNS" --duration "${DUR}s" --warmup 1s \
    --server-pid "$NCHAN_PID" --json "$OUT/r$r-nchan.json" | tee -a "$OUT/log.txt"
done
python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" "$PIPELINE" <<'PY' | tee "$OUT/summary.md" | tee -a perf/RESULTS.md
import json, sys, glob, os, statistics as st
out, rounds, dur, conns, pipeline = sys.argv[1:]
print(f"### WebSocket publish, {os.path.basename(out)}\n")
print(f"1 shard, io_uring, durability os, 1 KiB structured event, closed loop, {dur}s per run after 1s warm-up, "
      f"{rounds} rounds in alternation; nchan (1 worker) HTTP publish in the same rounds. CPU is the server's, from /proc.\n")
print("| target | connections x in flight | events/s (median) | server CPU µs per event (median) | per round | / nchan HTTP |")
print("|---|---|---|---|---|---|")
runs = lambda n: [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r*-{n}.json"))]
cpu = lambda n: st.median(r["server_cpu_us_per_op"] for r in runs(n))
for name, label, shape in [("http", "evmesh HTTP", f"{conns} x 1"), ("ws1", "evmesh WebSocket", f"{conns} x 1"),
                           ("wsp", "evmesh WebSocket", f"{int(conns) // 4} x {pipeline}"), ("nchan", "nchan HTTP", f"{conns} x 1")]:
    rs = runs(name)
    per = ", ".join("%.2f" % r["server_cpu_us_per_op"] for r in rs)
    rate = st.median(r["throughput"] for r in rs)
    print(f"| {label} | {shape} | {rate:.0f} | {cpu(name):.2f} | {per} | {cpu(name) / cpu('nchan'):.2f}x |")
print()
PY
