#!/usr/bin/env bash
# What an idle WebSocket session holds, by component: the server runs under heaptrack,
# SESSIONS subscribers attach (ack=none by default; ACK=1 acknowledged) while one event a second
# flows, and the server is killed with the sessions attached, so what heaptrack reports as
# "leaked" is exactly what was live then. Prints the live bytes per session by allocation site
# (heaptrack's own frames folded), largest first. Needs heaptrack (Debian's package).
#
#   EVMESH_BIN=/path/to/evmesh bash perf/idle_heap.sh      (SESSIONS=5000 ACK=0; SSE=1: event streams)
set -euo pipefail
cd "$(dirname "$0")/.."
SESSIONS=${SESSIONS:-5000}; ACK=${ACK:-0}; SSE=${SSE:-0}
if [ "$ACK" = 1 ]; then QUERY="subscription=idle"; ACKFLAG=(--ack); else QUERY="subscription=idle&ack=none"; ACKFLAG=(); fi
SUB="ws://127.0.0.1:18480/events/ws?$QUERY"
if [ "$SSE" = 1 ]; then SUB="http://127.0.0.1:18480/events/sse?subscription=idle"; ACKFLAG=(--ack); fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/evmesh-target}"
command -v heaptrack >/dev/null || apt-get install -y -q heaptrack >/dev/null
[ -n "${EVMESH_BIN:-}" ] || cargo build --release -q --workspace
EVMESH=${EVMESH_BIN:-$CARGO_TARGET_DIR/release/evmesh}; LOADGEN=$CARGO_TARGET_DIR/release/loadgen
DIR=$(mktemp -d /var/tmp/evmesh-heap.XXXX)
trap 'pkill -KILL -f "serve --shards 1 --data-dir $DIR" 2>/dev/null || true; rm -rf "$DIR"' EXIT
# glibc's malloc, which heaptrack sees (the binary's own heap is mimalloc: sys::Heap); the live
# bytes are the same either way, the resident set is not (perf/idle_sessions.sh measures that).
EVMESH_ALLOCATOR=system heaptrack -o "$DIR/heap" "$EVMESH" serve --shards 1 --data-dir "$DIR/data" --listen 127.0.0.1:18480 \
  --admin-listen 127.0.0.1:18481 --max-connections $((SESSIONS + 100)) > "$DIR/evmesh.log" 2>&1 &
for _ in $(seq 100); do curl -sf http://127.0.0.1:18481/readyz >/dev/null && break; sleep 0.2; done
curl -sf 127.0.0.1:18480/events/subscribe -d '{"subscription":"idle","topic":"idle","mode":"BROADCAST"}' >/dev/null
"$LOADGEN" --url "http://127.0.0.1:18480/events/publish?topic=idle" --connections 1 --duration 30s --warmup 2s --rate 1 \
  --subscribe-url "$SUB" --subscribers "$SESSIONS" "${ACKFLAG[@]}" > "$DIR/loadgen.txt" 2>&1 &
LG=$!
for _ in $(seq 150); do
  open=$(curl -sf 127.0.0.1:18481/metrics | awk '/^evmesh_connections_open/{s+=$2} END{print s+0}')
  [ "$open" -ge "$SESSIONS" ] && break; sleep 0.2
done
sleep 4
pkill -KILL -f "serve --shards 1 --data-dir $DIR"
sleep 2; kill "$LG" 2>/dev/null || true; wait 2>/dev/null || true
heaptrack_print -f "$DIR/heap.zst" --print-peaks 0 --print-allocators 0 --print-temporary 0 --print-leaks 0 \
  --flamegraph-cost-type leaked -F "$DIR/live.folded" >/dev/null 2>&1
python3 - "$DIR/live.folded" "$SESSIONS" <<'PY'
import sys
n = int(sys.argv[2])
skip = ('alloc (', 'alloc_impl', 'allocate (', 'try_allocate', 'with_capacity', 'raw_vec', 'grow', '_rdl_',
        'aligned_malloc', 'GlobalAlloc', 'box_new', 'new<> (boxed', 'realloc', 'finish_grow', 'do_reserve')
rows = []
for line in open(sys.argv[1]):
    stack, _, count = line.rstrip().rpartition(' ')
    rows.append((int(count), [f for f in stack.split(';') if not any(s in f for s in skip)]))
print(f"live heap per session: {sum(c for c, _ in rows) / n:.0f} bytes (one-time allocations included)")
for c, frames in sorted(rows, key=lambda r: -r[0]):
    if c / n < 8:
        break
    print(f"{c / n:7.0f}  " + " <- ".join(reversed(frames[-7:]))[:220])
PY
