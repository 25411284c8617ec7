#!/usr/bin/env bash
# Tiered storage to S3 (moto, the S3-compatible server the tests use; a Python server on this
# same 2-core machine, so what it costs is not S3's). Round by round, alternating, evmesh with
# 1 shard, 4 MiB segments, open-loop publishing of 1 KiB structured CloudEvents at RATE/s for
# DUR s (loadgen, 16 connections, one partition):
# (1) tiering off;
# (2) tiering on (uploads looked for every 100 ms, every uploaded local copy deleted): the
#     uploads run during the load. Measured: publish p50/p99/p99.9 beside (1), the upload's CPU
#     (the evmesh-tier threads' CPU, from /proc/PID/task) per MiB uploaded;
# (3) then a cold read: the same bucket, an instance on an empty disk, one subscriber reading the
#     whole history (every byte from the bucket) with `evmesh sub`: events/s and MiB/s.
# Appends a table to perf/RESULTS.md.
#
#   bash perf/tier.sh        (ROUNDS=3 DUR=10 RATE=3000 env knobs)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-10}; RATE=${RATE:-3000}
PEERS=0 source perf/common.sh
VENV=/var/tmp/evmesh-venv
"$VENV/bin/python" -c 'import moto.server' 2>/dev/null || "$VENV/bin/pip" install -q "moto[server]==5.1.22"
OUT=$ROOT/perf/results/tier-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
MP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$VENV/bin/moto_server" -H 127.0.0.1 -p "$MP" > "$OUT/moto.log" 2>&1 &
MOTO=$!
trap 'kill $MOTO 2>/dev/null || true' EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$MP") 2>/dev/null && break; sleep 0.1; done
export AWS_ACCESS_KEY_ID=perf AWS_SECRET_ACCESS_KEY=perf
TCK=$(getconf CLK_TCK)
# tier_ticks PID: CPU ticks of the process's evmesh-tier threads (the tier's runtime and its
# blocking pool).
tier_ticks() {
  local t=0 f
  for f in /proc/"$1"/task/*/stat; do
    [ "$(cat "${f%stat}comm" 2>/dev/null)" = evmesh-tier ] && t=$(( t + $(awk '{print $14 + $15}' "$f") ))
  done
  echo "$t"
}
metric() { curl -s "$1/metrics" | awk -v n="$2" '$1 == n {print $2}'; }
serve() { # serve DIR FLAGS...: starts evmesh, sets PID
  "$EVMESH" serve --shards 1 --data-dir "$1" --listen 127.0.0.1:18480 --admin-listen 127.0.0.1:18481 \
    --segment-bytes 4194304 "${@:2}" >> "$OUT/evmesh.log" 2>&1 &
  PID=$!
  wait_ready http://127.0.0.1:18481
}
for r in $(seq "$ROUNDS"); do
  for mode in off on; do
    dir=$(mktemp -d /var/tmp/evmesh-perf.XXXX)
    flags=()
    [ "$mode" = on ] && flags=(--tier-s3-bucket "perf-$r" --tier-s3-endpoint "http://127.0.0.1:$MP"
      --tier-s3-upload-interval-ms 100 --local-retention-bytes 1)
    [ "$mode" = on ] && curl -sf -X PUT "http://127.0.0.1:$MP/perf-$r" > /dev/null
    serve "$dir" "${flags[@]}"
    curl -sf -X PUT 127.0.0.1:18481/admin/topics/k -d '{"partitions":1}' > /dev/null
    t0=$(tier_ticks "$PID")
    "$LOADGEN" --url "http://127.0.0.1:18480/events/publish?topic=k" --connections 16 --rate "$RATE" \
      --duration "${DUR}s" --warmup 1s --server-pid "$PID" --json "$OUT/r$r-$mode.json" | tee -a "$OUT/log.txt"
    if [ "$mode" = on ]; then
      # The uploads of what the load sealed, to the end.
      sealed=$(( $(ls "$dir/segments/t.k/0/" | grep -c '\.log$') - 1 + $(metric http://127.0.0.1:18481 evmesh_tier_local_deleted_total) ))
      for _ in $(seq 300); do
        [ "$(metric http://127.0.0.1:18481 evmesh_tier_uploaded_segments_total)" -ge "$sealed" ] && break; sleep 0.1
      done
      t1=$(tier_ticks "$PID")
      up=$(metric http://127.0.0.1:18481 evmesh_tier_uploaded_bytes_total)
      events=$(curl -s 127.0.0.1:18481/admin/topics | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["partitions"][0]["end_offset"])')
      kill "$PID"; wait "$PID" 2>/dev/null || true; rm -rf "$dir"
      # The cold read: an empty disk, the same bucket.
      dir=$(mktemp -d /var/tmp/evmesh-perf.XXXX)
      serve "$dir" "${flags[@]}"
      tiered=$(curl -s 127.0.0.1:18481/admin/topics | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["partitions"][0]["end_offset"])')
      curl -sf -X POST 127.0.0.1:18480/events/subscribe -H 'content-type: application/json' \
        -d '{"subscription":"cold","topic":"k","mode":"LOAD_BALANCE","start":"earliest"}' > /dev/null
      c0=$(ticks "$PID"); s0=$(date +%s.%N)
      "$EVMESH" sub --url http://127.0.0.1:18480 --subscription cold --max "$tiered" --window 4096 > /dev/null 2>>"$OUT/log.txt"
      s1=$(date +%s.%N); c1=$(ticks "$PID")
      fetched=$(metric http://127.0.0.1:18481 evmesh_tier_fetched_bytes_total)
      echo "{\"upload_cpu_s\": $(( t1 - t0 ))e0, \"tck\": $TCK, \"uploaded_bytes\": $up, \"published\": $events, \"cold_events\": $tiered, \"cold_s\": $(python3 -c "print($s1 - $s0)"), \"cold_cpu_ticks\": $(( c1 - c0 )), \"fetched_bytes\": $fetched}" \
        > "$OUT/r$r-tier.json"
    fi
    kill "$PID"; wait "$PID" 2>/dev/null || true; rm -rf "$dir"
  done
done
python3 - "$OUT" "$ROUNDS" "$DUR" "$RATE" <<'PY' | tee "$OUT/summary.md"
import json, sys, os, statistics as st
out, rounds, dur, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"### tiered storage to S3 (moto), {os.path.basename(out)}\n")
print(f"{rounds} rounds in alternation, open loop at {rate}/s for {dur:.0f} s, 16 connections, 1 KiB events, 1 partition, 4 MiB segments; evmesh 1 shard; moto (Python) on the same 2 cores.\n")
print("| tiering | throughput/s (median) | p50 / p99 / p99.9 µs (median of rounds) | p99 per round | evmesh CPU µs per publish |")
print("|---|---|---|---|---|")
for mode, label in [("off", "off"), ("on", "on, uploads running (every 100 ms, local copies deleted)")]:
    ev = [json.load(open(f"{out}/r{r}-{mode}.json")) for r in range(1, rounds + 1)]
    lat = [st.median(e["latency_us"][k] for e in ev) for k in ("p50", "p99", "p999")]
    p99 = [e["latency_us"]["p99"] for e in ev]
    tp = st.median(e["ok"] / e["duration_s"] for e in ev)
    cpu = st.median(e["server_cpu_us_per_op"] for e in ev)
    print(f"| {label} | {tp:.0f} | {' / '.join(f'{x:.0f}' for x in lat)} | {', '.join(f'{x:.0f}' for x in p99)} | {cpu:.1f} |")
t = [json.load(open(f"{out}/r{r}-tier.json")) for r in range(1, rounds + 1)]
mib = 1 << 20
up = [x["upload_cpu_s"] / x["tck"] * 1e6 / (x["uploaded_bytes"] / mib) for x in t]
cold = [x["cold_events"] / x["cold_s"] for x in t]
cold_mib = [x["fetched_bytes"] / mib / x["cold_s"] for x in t]
cold_cpu = [x["cold_cpu_ticks"] / x["tck"] * 1e6 / x["cold_events"] for x in t]
print(f"\n- upload CPU (the evmesh-tier threads) per MiB uploaded: median {st.median(up):.0f} µs (rounds: {', '.join(f'{x:.0f}' for x in up)}); {st.median(x['uploaded_bytes'] for x in t) / mib:.1f} MiB uploaded per round")
print(f"- cold read of the whole history from the bucket (an empty disk, one `evmesh sub` subscriber): median {st.median(cold):.0f} events/s, {st.median(cold_mib):.1f} MiB/s fetched (rounds: {', '.join(f'{x:.0f}' for x in cold)} events/s); evmesh CPU {st.median(cold_cpu):.1f} µs per event read")
PY
{ echo; echo "Command: \`ROUNDS=$ROUNDS DUR=$DUR RATE=$RATE bash perf/tier.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
