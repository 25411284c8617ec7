#!/usr/bin/env bash
# Where a server's CPU goes under one of the perf loads: `perf record` of the server process
# (evmesh, one shard pinned to CPU 0, or nchan's worker, pinned there too) while loadgen drives
# it from the other CPU, reported as the kernel / user split and the heaviest symbols. A goal
# the perf scripts show missed gets its profile from here, evmesh's and nchan's under the same
# load, in one run.
#
#   CASE=publish|open|batch|fanout1000|fanout5000|wide TARGETS="evmesh nchan" bash perf/profile.sh
#   (open: publishes open loop at RATE per second, 24000 unless given, 64 connections, two
#   generator threads, as perf/tail_latency.sh's runs; wide: 8,000 subscribers of one event a
#   second; TARGETS may also name nginx-200, nginx's bare `return 200` for the same POST)
#   (DUR=6 seconds recorded after the warm-up; EVMESH_FLAGS="--io-driver epoll" passes serve flags)
#
# The text reports land in perf/results/profile-CASE-<stamp>/ (perf.data itself is not kept);
# a summary is appended to perf/RESULTS.md. Needs `perf` (Debian's linux-perf) and root or
# perf_event_paranoid <= 1.
set -euo pipefail
cd "$(dirname "$0")/.."
CASE=${CASE:-publish}; DUR=${DUR:-6}; TARGETS=${TARGETS:-evmesh nchan}; EVMESH_FLAGS=${EVMESH_FLAGS:-}
RATE=${RATE:-24000}
source perf/common.sh
GEN_CPUS=${GEN_CPUS:-1-$(( $(nproc) - 1 ))}
taskset -pc 0 "$NCHAN_PID" > /dev/null
OUT=$ROOT/perf/results/profile-$CASE-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
# `wide` (8,000 subscribers, one event a second) takes a while to attach them all.
WARMUP=2; [ "$CASE" = wide ] && WARMUP=6

# load URL PID [SUBSCRIBE-URL]: CASE's load for WARMUP + DUR seconds, in the background.
load() {
  local args=(--url "$1" --duration "$((DUR + 1))s" --warmup "${WARMUP}s" --server-pid "$2" --json "$OUT/$target.load.json")
  case $CASE in
    publish) args+=(--connections 64) ;;
    open) args+=(--connections 64 --threads 2 --rate "$RATE") ;;
    batch) args+=(--connections 16 --body batch --batch 10) ;;
    fanout1000) args+=(--connections 8 --rate 1000 --subscribe-url "$3" --subscribers 100) ;;
    fanout5000) args+=(--connections 8 --rate 5000 --subscribe-url "$3" --subscribers 100) ;;
    wide) args+=(--connections 1 --rate 1 --subscribe-url "$3" --subscribers 8000) ;;
    *) echo "CASE is publish, open, batch, fanout1000, fanout5000 or wide" >&2; exit 2 ;;
  esac
  taskset -c "$GEN_CPUS" "$LOADGEN" "${args[@]}" >> "$OUT/log.txt" 2>&1 &
  load_pid=$!
}

# record NAME PID: perf samples of PID (call graphs) for DUR seconds, then the text reports.
record() {
  perf record -q -F 999 -g -o "$OUT/.perf.data" -p "$2" -- sleep "$DUR" 2>> "$OUT/log.txt"
  perf report -i "$OUT/.perf.data" --no-children --sort dso --stdio 2>/dev/null | grep -v '^$' > "$OUT/$1.dso.txt"
  perf report -i "$OUT/.perf.data" --no-children --sort dso,symbol --stdio -g none --percent-limit 0.5 2>/dev/null \
    | grep -v '^$' > "$OUT/$1.symbols.txt"
  rm -f "$OUT/.perf.data"
}

for target in $TARGETS; do
  case $target in
    evmesh)
      dir=$(mktemp -d /var/tmp/evmesh-profile.XXXX)
      # shellcheck disable=SC2086
      "$EVMESH" serve --shards 1 $EVMESH_FLAGS --data-dir "$dir" --listen 127.0.0.1:18180 \
        --admin-listen 127.0.0.1:18181 > "$OUT/evmesh.log" 2>&1 &
      pid=$!
      wait_ready http://127.0.0.1:18181
      curl -sf 127.0.0.1:18180/events/subscribe -d '{"subscription":"fan","topic":"perf","mode":"BROADCAST"}' >/dev/null
      load "http://127.0.0.1:18180/events/publish?topic=perf" "$pid" "ws://127.0.0.1:18180/events/ws?subscription=fan&ack=none"
      sleep "$WARMUP"; record evmesh "$pid"; wait "$load_pid"
      kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir" ;;
    nchan)
      [ "$CASE" = batch ] && { echo "nchan has no batch publish: skipped" >> "$OUT/log.txt"; continue; }
      load "http://127.0.0.1:18080/pub?id=profile" "$NCHAN_PID" "ws://127.0.0.1:18080/sub?id=profile"
      sleep "$WARMUP"; record nchan "$NCHAN_PID"; wait "$load_pid" ;;
    nginx-200)
      case $CASE in publish | open) ;; *) echo "nginx-200 only answers publishes: skipped" >> "$OUT/log.txt"; continue ;; esac
      load "http://127.0.0.1:18080/ok_post" "$NCHAN_PID"
      sleep "$WARMUP"; record nginx-200 "$NCHAN_PID"; wait "$load_pid" ;;
  esac
done

python3 - "$OUT" "$CASE" "$DUR" "$TARGETS" "$EVMESH_FLAGS" <<'PY' | tee "$OUT/summary.md"
import json, os, re, sys
out, case, dur, targets, flags = sys.argv[1:]
print(f"### profile, {os.path.basename(out)}\n")
print(f"`perf record -F 999 -g` of the server for {dur}s under the `{case}` load (perf/profile.sh), "
      f"server on CPU 0, loadgen on the others{', evmesh ' + flags if flags else ''}. "
      "Shares of the server's samples (self time); the full symbol lists are in the raw directory.\n")
print("| target | ops/s | server CPU µs per op: kernel + user | kernel | user | heaviest kernel symbols | heaviest user-space symbols |")
print("|---|---|---|---|---|---|---|")
for t in targets.split():
    path = f"{out}/{t}.dso.txt"
    if not os.path.exists(path):
        continue
    kernel = user = 0.0
    for line in open(path):
        m = re.match(r"\s*([\d.]+)%\s+(\S+)", line)
        if m:
            share = float(m.group(1))
            if m.group(2) == "[kernel.kallsyms]":
                kernel += share
            else:
                user += share
    top = {"k": [], ".": []}
    for line in open(f"{out}/{t}.symbols.txt"):
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[([k.])\]\s+(.+?)(\s{2,}-\s+-)?\s*$", line)
        if m and len(top[m.group(3)]) < 5:
            top[m.group(3)].append(f"`{m.group(4).strip()[:70]}` {m.group(1)}%")
    load = json.load(open(f"{out}/{t}.load.json"))
    rate = load.get("fanout", {}).get("deliveries_per_s") or load.get("throughput", 0)
    cpu = load.get("fanout", {}).get("server_cpu_us_per_delivery") or load.get("server_cpu_us_per_op") or 0
    split = f"{cpu * kernel / 100:.2f} + {cpu * user / 100:.2f}" if cpu else "-"
    print(f"| {t} | {rate:.0f} | {split} | {kernel:.1f}% | {user:.1f}% | {'; '.join(top['k'])} | {'; '.join(top['.'])} |")
PY
RATE_SHOWN=""; [ "$CASE" = open ] && RATE_SHOWN="RATE=$RATE "
{ echo; echo "Command: \`CASE=$CASE ${RATE_SHOWN}DUR=$DUR TARGETS=\"$TARGETS\" EVMESH_FLAGS=\"$EVMESH_FLAGS\" bash perf/profile.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
