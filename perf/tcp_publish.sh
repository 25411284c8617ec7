#!/usr/bin/env bash
# Publishing over the classic EventMesh TCP bridge (tcp_listen) beside keep-alive HTTP and
# WebSocket publishing of the same 1 KiB structured event, in one run, and nchan's HTTP publish
# (the peer) in the same rounds:
#
#   bash perf/tcp_publish.sh      (ROUNDS=3 DUR=5 CONNS=64 PIPELINE=16)
#
# Per round, in alternation: evmesh HTTP (CONNS connections, one request in flight each),
# evmesh WebSocket and evmesh TCP with one message in flight per connection (CONNS), evmesh
# WebSocket and TCP with PIPELINE messages in flight (CONNS/4 connections), nchan HTTP (CONNS).
# 1 shard, io_uring, durability os; the TCP event is the same event with its topic as
# `subject` (how a CloudEvent names its topic over TCP). Server CPU per event from /proc.
# Appended to perf/RESULTS.md; raw reports in perf/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-5}; CONNS=${CONNS:-64}; PIPELINE=${PIPELINE:-16}
source perf/common.sh
OUT=$ROOT/perf/results/tcp-publish-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
run() { "$LOADGEN" "$@" --duration "${DUR}s" --warmup 1s | tee -a "$OUT/log.txt"; }
for r in $(seq "$ROUNDS"); do
  dir=$(mktemp -d /var/tmp/evmesh-tcpp.XXXX)
  "$EVMESH" serve --shards 1 --io-driver uring --data-dir "$dir" --listen 127.0.0.1:18380 \
    --admin-listen 127.0.0.1:18381 --tcp-listen 127.0.0.1:18382 > "$OUT/evmesh.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18381 || { cat "$OUT/evmesh.log" >&2; exit 1; }
  run --url "http://127.0.0.1:18380/events/publish?topic=perf" --connections "$CONNS" --server-pid "$pid" \
    --json "$OUT/r$r-http.json"
  run --ws --url "http://127.0.0.1:18380/events/ws?publish=perf" --connections "$CONNS" --server-pid "$pid" \
    --json "$OUT/r$r-ws1.json"
  run --eventmesh-tcp --url "http://127.0.0.1:18382/perf" --connections "$CONNS" --server-pid "$pid" \
    --json "$OUT/r$r-tcp1.json"
  run --ws --pipeline "$PIPELINE" --url "http://127.0.0.1:18380/events/ws?publish=perf" \
    --connections $(( CONNS / 4 )) --server-pid "$pid" --json "$OUT/r$r-wsp.json"
  run --eventmesh-tcp --pipeline "$PIPELINE" --url "http://127.0.0.1:18382/perf" \
    --connections $(( CONNS / 4 )) --server-pid "$pid" --json "$OUT/r$r-tcpp.json"
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
  run --url "http://127.0.0.1:18080/pub?id=tcpp_$r" --connections "$CONNS" --server-pid "$NCHAN_PID" \
    --json "$OUT/r$r-nchan.json"
done
python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" "$PIPELINE" <<'PY' | tee "$OUT/summary.md" | tee -a perf/RESULTS.md
import json, sys, glob, os, statistics as st
out, rounds, dur, conns, pipeline = sys.argv[1:]
print(f"### Classic TCP bridge publish, {os.path.basename(out)}\n")
print(f"`bash perf/tcp_publish.sh` (ROUNDS={rounds} DUR={dur} CONNS={conns} PIPELINE={pipeline}). 1 shard, io_uring, "
      f"durability os, 1 KiB structured event, closed loop, {dur}s per run after 1s warm-up, {rounds} rounds in "
      "alternation; nchan (1 worker) HTTP publish in the same rounds. CPU is the server's, from /proc.\n")
print("| target | connections x in flight | events/s (median) | server CPU µs per event (median) | per round "
      "| p50 / p99 / p99.9 µs (median) | / evmesh HTTP | / nchan HTTP |")
print("|---|---|---|---|---|---|---|---|")
runs = lambda n: [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r*-{n}.json"))]
cpu = lambda n: st.median(r["server_cpu_us_per_op"] for r in runs(n))
def lat(rs):
    pick = lambda k: st.median(r["latency_us"][k] for r in rs)
    return "%d / %d / %d" % (pick("p50"), pick("p99"), pick("p999"))
for name, label, shape in [("http", "evmesh HTTP", f"{conns} x 1"), ("ws1", "evmesh WebSocket", f"{conns} x 1"),
                           ("tcp1", "evmesh classic TCP", f"{conns} x 1"),
                           ("wsp", "evmesh WebSocket", f"{int(conns) // 4} x {pipeline}"),
                           ("tcpp", "evmesh classic TCP", f"{int(conns) // 4} x {pipeline}"),
                           ("nchan", "nchan HTTP", f"{conns} x 1")]:
    rs = runs(name)
    per = ", ".join("%.2f" % r["server_cpu_us_per_op"] for r in rs)
    rate = st.median(r["throughput"] for r in rs)
    print(f"| {label} | {shape} | {rate:.0f} | {cpu(name):.2f} | {per} | {lat(rs)} | {cpu(name) / cpu('http'):.2f}x "
          f"| {cpu(name) / cpu('nchan'):.2f}x |")
print()
PY
