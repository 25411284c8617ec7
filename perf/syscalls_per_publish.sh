#!/usr/bin/env bash
# System calls per publish on the shard, counted by the kernel's syscall tracepoints (`perf stat`,
# needs root), for this checkout's build and optionally another: what a change to the read, write
# or storage path does to the kernel's share, which no instruction count shows.
#
#   [BEFORE=/path/to/old/evmesh] bash perf/syscalls_per_publish.sh   (DRIVER=epoll CONNS=64 RATE=)
#
# Each build serves 1 shard on CPU 0, durability os; loadgen on the other CPUs drives CONNS
# keep-alive connections of 1 KiB structured publishes, closed loop (RATE empty) or open loop at
# RATE/s, while `perf stat` counts the server's calls for 3 seconds; each count is divided by the
# publishes the server counted in those seconds (evmesh_publish_requests_total). Not a timing.
# The table is appended to perf/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DRIVER=${DRIVER:-epoll}; CONNS=${CONNS:-64}; RATE=${RATE:-}
PEERS=0 source perf/common.sh
GEN_CPUS=${GEN_CPUS:-1-$(( $(nproc) - 1 ))}
CALLS=(epoll_wait io_uring_enter recvfrom sendto pwrite64 writev futex)
publishes() { curl -sf http://127.0.0.1:18281/metrics | awk '/^evmesh_publish_requests_total/ {s += $2} END {print s + 0}'; }
run() {
  local bin=$1 dir pid lg before after events
  dir=$(mktemp -d /var/tmp/evmesh-syscalls.XXXX)
  taskset -c 0 "$bin" serve --shards 1 --io-driver "$DRIVER" --data-dir "$dir" \
    --listen 127.0.0.1:18280 --admin-listen 127.0.0.1:18281 >/dev/null 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18281
  local args=(--url "http://127.0.0.1:18280/events/publish?topic=perf" --connections "$CONNS" --duration 6s)
  [ -n "$RATE" ] && args+=(--rate "$RATE")
  taskset -c "$GEN_CPUS" "$LOADGEN" "${args[@]}" >/dev/null 2>&1 &
  lg=$!
  sleep 2
  events=$(printf 'syscalls:sys_enter_%s,' "${CALLS[@]}")
  # The publishes are read inside the counted window (perf takes a while to attach).
  export -f publishes
  perf stat -x, -e "${events%,}" -p "$pid" -- bash -c 'publishes > "$0.n"; sleep 3; publishes >> "$0.n"' "$OUT" 2> "$OUT.stat"
  read -r before after < <(tr '\n' ' ' < "$OUT.n")
  wait "$lg" || true
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
  python3 - "$OUT.stat" "$(( after - before ))" "${CALLS[@]}" <<'PY'
import sys
stat, n, calls = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
counts = {}
for line in open(stat):
    f = line.strip().split(",")
    if len(f) > 2 and f[0].isdigit():
        counts[f[2].removeprefix("syscalls:sys_enter_")] = int(f[0])
print(" | ".join(f"{counts.get(c, 0) / max(n, 1):.3f}" for c in calls) + f" | {n}")
PY
}
OUT=$(mktemp /tmp/evmesh-syscalls.XXXX)
trap 'rm -f "$OUT" "$OUT.stat" "$OUT.n"' EXIT
{
  echo "### system calls per publish on the shard, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Command: \`${BEFORE:+BEFORE=$BEFORE }DRIVER=$DRIVER CONNS=$CONNS${RATE:+ RATE=$RATE} bash perf/syscalls_per_publish.sh\` (1 shard on CPU 0, durability os, 1 KiB structured event, ${RATE:-closed loop}${RATE:+/s}; \`perf stat\` of the syscall tracepoints for 3 s)"
  echo
  echo "| build | $(printf '%s | ' "${CALLS[@]}")publishes counted |"
  echo "|---|$(printf -- '---|%.0s' "${CALLS[@]}")---|"
  [ -n "${BEFORE:-}" ] && echo "| before | $(run "$BEFORE") |"
  echo "| this build | $(run "$EVMESH") |"
} | tee -a perf/RESULTS.md
