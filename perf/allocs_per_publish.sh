#!/usr/bin/env bash
# Heap allocations per publish in the running server, counted by uprobes on libc's malloc and
# realloc (needs root for `perf probe`), for this checkout's build and optionally another:
#
#   [BEFORE=/path/to/old/evmesh] bash perf/allocs_per_publish.sh      (N=20000 CONNS=16)
#
# Each build serves 1 shard, durability os; loadgen sends N 1 KiB structured publishes (after a
# warm-up of N/4) at a fixed rate while `perf stat` counts the calls in the server process; the
# count is divided by the events the server says it stored (evmesh_events_published_total).
# Not a timing. The table is appended to perf/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-20000}; CONNS=${CONNS:-16}; RATE=${RATE:-4000}
PEERS=0 source perf/common.sh
LIBC=$(ldd "$EVMESH" | awk '/libc.so/ {print $3}')
perf probe -q -x "$LIBC" malloc 2>/dev/null || true
perf probe -q -x "$LIBC" realloc 2>/dev/null || true
published() { curl -sf http://127.0.0.1:18281/metrics | awk '/^evmesh_events_published_total/ {s += $2} END {print s + 0}'; }
run() {
  local bin=$1 dir pid before after calls
  dir=$(mktemp -d /var/tmp/evmesh-allocs.XXXX)
  # glibc's malloc, which the probes count (the binary's own heap is mimalloc: sys::Heap).
  EVMESH_ALLOCATOR=system "$bin" serve --shards 1 --data-dir "$dir" --listen 127.0.0.1:18280 --admin-listen 127.0.0.1:18281 >/dev/null 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18281
  local secs=$(( N / RATE ))
  "$LOADGEN" --url "http://127.0.0.1:18280/events/publish?topic=perf" --connections "$CONNS" --rate "$RATE" \
    --duration "$(( secs / 4 + 1 ))s" >/dev/null
  before=$(published)
  calls=$( { perf stat -x, -e probe_libc:malloc,probe_libc:realloc -p "$pid" -- \
    "$LOADGEN" --url "http://127.0.0.1:18280/events/publish?topic=perf" --connections "$CONNS" --rate "$RATE" \
    --duration "${secs}s" >/dev/null; } 2>&1 | awk -F, '/probe_libc/ {s += $1} END {print s}')
  after=$(published)
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
  python3 -c "import sys; c, n = int(sys.argv[1]), int(sys.argv[2]); print(f'{c / max(n, 1):.1f} {n}')" "$calls" "$(( after - before ))"
}
{
  echo "### heap allocations per publish in the server, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Command: \`${BEFORE:+BEFORE=$BEFORE }N=$N CONNS=$CONNS RATE=$RATE bash perf/allocs_per_publish.sh\` (uprobes on libc malloc + realloc in the server process, 1 shard, durability os, 1 KiB structured event, $RATE/s)"
  echo
  echo "| build | allocations per publish | publishes counted |"
  echo "|---|---|---|"
  if [ -n "${BEFORE:-}" ]; then read -r a n < <(run "$BEFORE"); echo "| before ($BEFORE) | $a | $n |"; fi
  read -r a n < <(run "$EVMESH"); echo "| this checkout ($(git rev-parse --short HEAD)) | $a | $n |"
  echo
} | tee -a perf/RESULTS.md
