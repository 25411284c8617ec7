#!/usr/bin/env bash
# CPU per event of batched publishes (a CloudEvents JSON batch of BATCH 1 KiB events per request)
# beside single-event publishes, for this checkout's build and optionally another, in one run:
#
#   [BEFORE=/path/to/old/evmesh] bash perf/batch_publish.sh      (ROUNDS=3 DUR=5 CONNS=16 BATCH=10)
#
# 1 shard, durability os, io_uring, closed loop; server CPU from /proc via loadgen --server-pid.
# Apache Iggy is not among the peers this machine installs (../shared/peers), so its figure
# (about 8-9 µs of server CPU per message with batches of 10 over HTTP, issue 11) is quoted, not
# measured here. The table is appended to perf/RESULTS.md; raw reports in perf/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-5}; CONNS=${CONNS:-16}; BATCH=${BATCH:-10}
PEERS=0 source perf/common.sh
OUT=$ROOT/perf/results/batch-publish-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
builds="after"; [ -n "${BEFORE:-}" ] && { cp "$BEFORE" "$OUT/.before-bin"; builds="before after"; }
trap 'rm -f "$OUT/.before-bin"' EXIT
for r in $(seq "$ROUNDS"); do
  for build in $builds; do
    bin=$EVMESH; [ "$build" = before ] && bin=$OUT/.before-bin
    for kind in single batch; do
      dir=$(mktemp -d /var/tmp/evmesh-batch.XXXX)
      "$bin" serve --shards 1 --io-driver uring --data-dir "$dir" --listen 127.0.0.1:18380 \
        --admin-listen 127.0.0.1:18381 > "$OUT/evmesh.log" 2>&1 &
      pid=$!
      wait_ready http://127.0.0.1:18381 || { cat "$OUT/evmesh.log" >&2; exit 1; }
      body=structured; [ "$kind" = batch ] && body=batch
      "$LOADGEN" --url "http://127.0.0.1:18380/events/publish?topic=perf" --connections "$CONNS" --duration "${DUR}s" \
        --warmup 1s --body "$body" --batch "$BATCH" --server-pid "$pid" --json "$OUT/r$r-$build-$kind.json" | tee -a "$OUT/log.txt"
      kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
    done
  done
done
python3 - "$OUT" "$BATCH" "$ROUNDS" "$DUR" "$CONNS" "$builds" <<'PY' | tee "$OUT/summary.md" | tee -a perf/RESULTS.md
import json, sys, glob, os, statistics as st
out, batch, rounds, dur, conns, builds = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
print(f"### batched publish, {os.path.basename(out)}\n")
print(f"1 shard, io_uring, durability os, {conns} keep-alive connections, closed loop, {dur}s per run after 1s warm-up, "
      f"{rounds} rounds in alternation; batch = a JSON batch of {batch} 1 KiB events per request. "
      "CPU is the server's, from /proc. Iggy (HTTP, batches of 10): about 8-9 µs per message, quoted from issue 11, not run here.\n")
print("| build | request | events/s (median) | server CPU µs per event (median) | per round |")
print("|---|---|---|---|---|")
for b in builds.split():
    for kind, n in [("single", 1), ("batch", batch)]:
        rs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r*-{b}-{kind}.json"))]
        cpu = [r["server_cpu_us_per_op"] / n for r in rs]
        print(f"| {b} | {kind} | {st.median(r['throughput'] * n for r in rs):.0f} | {st.median(cpu):.2f} | {', '.join(f'{c:.2f}' for c in cpu)} |")
print()
PY
