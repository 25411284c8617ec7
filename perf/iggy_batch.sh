#!/usr/bin/env bash
# Batched publish beside Apache Iggy's HTTP API, measured in one run (issue 11's bar: evmesh's
# server CPU per event <= 0.3x Iggy's per message, batches of 10).
#
#   IGGY_SERVER=/path/to/iggy-server bash perf/iggy_batch.sh     (ROUNDS=3 DUR=6 CONNS=16 BATCH=10)
#
# Iggy is not among the peers ../shared/peers installs and is not built by anything committed
# here: build its `iggy-server` yourself (perf/RESULTS.md says which version and how it was built
# for the committed numbers) and name it in IGGY_SERVER.
#
# evmesh runs twice a round: segments written through the page cache (the default) and with
# O_DIRECT through io_uring (`--direct-io true`).
#
# Both servers get one core (CPU 0: evmesh's one shard, Iggy's one shard by its
# `system.sharding.cpu_allocation`), wrk runs on the other CPUs with CONNS keep-alive connections
# in a closed loop, in alternation over ROUNDS. Each request carries BATCH messages of 1 KiB of
# user data: for evmesh a CloudEvents JSON batch of BATCH structured events (`data` a 1 KiB-ish
# JSON string), for Iggy `POST /streams/perf/topics/perf/messages` with BATCH messages whose
# payload is 1 KiB (base64 in the JSON, as its HTTP API takes it), balanced partitioning over one
# partition, authenticated with the JWT its login returns. Durability: evmesh `os` (one write per
# event-loop turn to the page cache), Iggy its defaults (messages buffered and written every 1,024
# messages or 1 MiB, no fsync). Server CPU is read from /proc (user + system) around each run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-6}; CONNS=${CONNS:-16}; BATCH=${BATCH:-10}
[ -x "${IGGY_SERVER:-}" ] || { echo "IGGY_SERVER must name an iggy-server binary" >&2; exit 2; }
PEERS=0 source perf/common.sh
GEN_CPUS=${GEN_CPUS:-1-$(( $(nproc) - 1 ))}
OUT=$ROOT/perf/results/iggy-batch-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
"$IGGY_SERVER" --version > "$OUT/iggy-version.txt" 2>&1 || true

# batch_lua FILE CONTENT-TYPE BODY-FILE [TOKEN]: wrk posting BODY-FILE.
batch_lua() {
  python3 - "$@" <<'PY'
import json, sys
out_path, ct, body_file = sys.argv[1], sys.argv[2], sys.argv[3]
token = sys.argv[4] if len(sys.argv) > 4 else ""
s = f'wrk.method = "POST"\nwrk.headers["Content-Type"] = {json.dumps(ct)}\n'
if token:
    s += f'wrk.headers["Authorization"] = {json.dumps("Bearer " + token)}\n'
s += f"wrk.body = {json.dumps(open(body_file).read())}\n"
s += 'done = function(summary, latency, requests)\n'
s += '  io.write(string.format("LAT %d %d %d\\n", latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))\n'
s += 'end\n'
open(out_path, "w").write(s)
PY
}

python3 - "$OUT" "$BATCH" <<'PY'
import base64, json, sys
out, n = sys.argv[1], int(sys.argv[2])
events = [{"specversion": "1.0", "id": f"b{i}", "source": "/perf", "type": "perf.event", "data": "x" * 900} for i in range(n)]
open(f"{out}/.evmesh-body.json", "w").write(json.dumps(events))
payload = base64.b64encode(bytes(1024)).decode()
msgs = {"partitioning": {"kind": "balanced", "value": ""}, "messages": [{"id": 0, "payload": payload} for _ in range(n)]}
open(f"{out}/.iggy-body.json", "w").write(json.dumps(msgs))
PY

# wrk_run (perf/common.sh) runs wrk; here pinned away from CPU 0.
wrk() { taskset -c "$GEN_CPUS" wrk "$@"; }

# evmesh_run ROUND NAME FLAGS...: one shard (pinned to CPU 0 by itself) on io_uring, durability os.
evmesh_run() {
  local r=$1 name=$2; shift 2
  dir=$(mktemp -d /var/tmp/evmesh-iggy-batch.XXXX)
  "$EVMESH" serve --shards 1 --io-driver uring --data-dir "$dir" --listen 127.0.0.1:18480 --admin-listen 127.0.0.1:18481 "$@" \
    > "$OUT/evmesh.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18481 || { cat "$OUT/evmesh.log" >&2; exit 1; }
  batch_lua "$OUT/.evmesh.lua" application/cloudevents-batch+json "$OUT/.evmesh-body.json"
  wrk_run "r$r-$name" "http://127.0.0.1:18480/events/publish?topic=perf" "$pid" "$OUT/.evmesh.lua"
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
}

for r in $(seq "$ROUNDS"); do
  # evmesh with segment writes through the page cache (the default), and with O_DIRECT
  # (direct_io = true), then Iggy.
  evmesh_run "$r" evmesh
  evmesh_run "$r" evmesh-direct --direct-io true

  # Iggy: one shard on CPU 0, HTTP only, a fresh data directory.
  dir=$(mktemp -d /var/tmp/iggy-batch.XXXX)
  IGGY_SYSTEM_PATH="$dir/data" IGGY_HTTP_ADDRESS=127.0.0.1:18490 IGGY_TCP_ENABLED=false IGGY_QUIC_ENABLED=false \
    IGGY_WEBSOCKET_ENABLED=false IGGY_SYSTEM_SHARDING_CPU_ALLOCATION=0..1 IGGY_ROOT_USERNAME=iggy IGGY_ROOT_PASSWORD=iggy \
    IGGY_HTTP_METRICS_ENABLED=false IGGY_TELEMETRY_ENABLED=false \
    "$IGGY_SERVER" > "$OUT/iggy.log" 2>&1 &
  pid=$!
  token=
  for _ in $(seq 100); do
    token=$(curl -sf 127.0.0.1:18490/users/login -H 'content-type: application/json' -d '{"username":"iggy","password":"iggy"}' \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["access_token"]["token"])' 2>/dev/null) && break
    sleep 0.2
  done
  [ -n "$token" ] || { echo "iggy did not start" >&2; cat "$OUT/iggy.log" >&2; exit 1; }
  auth=(-H "authorization: Bearer $token" -H 'content-type: application/json')
  curl -sf "${auth[@]}" 127.0.0.1:18490/streams -d '{"name":"perf"}' > /dev/null
  curl -sf "${auth[@]}" 127.0.0.1:18490/streams/perf/topics \
    -d '{"name":"perf","partitions_count":1,"compression_algorithm":"none","message_expiry":0,"max_topic_size":0}' > /dev/null
  # The messages must be accepted (201) before anything is measured.
  code=$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" 127.0.0.1:18490/streams/perf/topics/perf/messages --data-binary @"$OUT/.iggy-body.json")
  [ "$code" = 201 ] || { echo "iggy refused the batch: $code" >&2; exit 1; }
  # Iggy's process: its shard thread is on CPU 0; the whole process's CPU is counted, as for evmesh.
  batch_lua "$OUT/.iggy.lua" application/json "$OUT/.iggy-body.json" "$token"
  wrk_run "r$r-iggy" "http://127.0.0.1:18490/streams/perf/topics/perf/messages" "$pid" "$OUT/.iggy.lua"
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
done
rm -f "$OUT"/.*.lua "$OUT"/.*-body.json

python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" "$BATCH" <<'PY' | tee "$OUT/summary.md"
import glob, json, os, statistics as st, sys
out, rounds, dur, conns, batch = sys.argv[1], *sys.argv[2:5], int(sys.argv[5])
version = open(f"{out}/iggy-version.txt").read().strip().splitlines()
print(f"### batched publish beside Apache Iggy, {os.path.basename(out)}\n")
print(f"One core each (CPU 0), `wrk -t1 -c{conns}` on the other CPU, closed loop, {dur}s per run after a 1s warm-up, "
      f"{rounds} rounds in alternation; each request carries {batch} messages of 1 KiB (evmesh: a CloudEvents JSON batch, "
      f"durability os, io_uring; `evmesh` writes segments through the page cache (the default), `evmesh-direct` with O_DIRECT (`direct_io = true`); "
      f"Iggy: its HTTP API's send-messages body, default persistence). Iggy: {version[-1] if version else '?'}.\n")
print("| target | messages/s (median) | server CPU µs per message (median) | per round | p50 / p99 / p99.9 µs per request (median) | non-2xx |")
print("|---|---|---|---|---|---|")
med = {}
for t in ["evmesh", "evmesh-direct", "iggy"]:
    rs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r*-{t}.wrk.json"))]
    cpu = [r["server_cpu_us_per_op"] / batch for r in rs]
    med[t] = st.median(cpu)
    lat = lambda k: int(st.median(r[k] for r in rs))
    print(f"| {t} | {st.median(r['throughput'] for r in rs) * batch:.0f} | {med[t]:.2f} | {', '.join(f'{c:.2f}' for c in cpu)} | "
          f"{lat('p50_us')} / {lat('p99_us')} / {lat('p999_us')} | {sum(r['errors'] for r in rs)} |")
print(f"\n- evmesh: CPU per message = {med['evmesh'] / med['iggy']:.2f}x Iggy's (issue 32's goal: <= 0.3x); "
      f"with O_DIRECT {med['evmesh-direct'] / med['iggy']:.2f}x")
PY
{ echo; echo "Command: \`IGGY_SERVER=... ROUNDS=$ROUNDS DUR=$DUR CONNS=$CONNS BATCH=$BATCH bash perf/iggy_batch.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
