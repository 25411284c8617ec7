#!/usr/bin/env bash
# Server memory per idle WebSocket session: SESSIONS subscribers attach to a BROADCAST
# subscription (ack=none; with ACK=1 acknowledged sessions, each its own consumer with
# delivery state on the partition owner) while one event a second flows; RSS of the evmesh
# process is read from /proc before and with the sessions attached. Appends the figure to
# perf/RESULTS.md.
#
#   bash perf/idle_sessions.sh        (SESSIONS=10000 ACK=0 env knobs; needs ~2x that many open files)
set -euo pipefail
cd "$(dirname "$0")/.."
SESSIONS=${SESSIONS:-10000}; ACK=${ACK:-0}
if [ "$ACK" = 1 ]; then QUERY="subscription=idle"; ACKFLAG=(--ack); else QUERY="subscription=idle&ack=none"; ACKFLAG=(); fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/evmesh-target}"
bash scripts/deps.sh
cargo build --release -q --workspace --bins
EVMESH=$CARGO_TARGET_DIR/release/evmesh; LOADGEN=$CARGO_TARGET_DIR/release/loadgen
DIR=$(mktemp -d /var/tmp/evmesh-idle.XXXX)
"$EVMESH" serve --shards 1 --data-dir "$DIR" --listen 127.0.0.1:18480 --admin-listen 127.0.0.1:18481 --max-connections $((SESSIONS + 100)) > "$DIR/evmesh.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do curl -sf http://127.0.0.1:18481/readyz >/dev/null && break; sleep 0.1; done
curl -sf 127.0.0.1:18480/events/subscribe -d '{"subscription":"idle","topic":"idle","mode":"BROADCAST"}' >/dev/null
before=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
"$LOADGEN" --url "http://127.0.0.1:18480/events/publish?topic=idle" --connections 1 --duration 8s --warmup 4s --rate 1 \
  --subscribe-url "ws://127.0.0.1:18480/events/ws?$QUERY" --subscribers "$SESSIONS" --server-pid "$PID" "${ACKFLAG[@]}" > "$DIR/loadgen.txt" &
LG=$!
# Attached and idle, half-way through the run.
for _ in $(seq 100); do
  open=$(curl -sf 127.0.0.1:18481/metrics | awk '/^evmesh_connections_open/{s+=$2} END{print s+0}')
  [ "$open" -ge "$SESSIONS" ] && break; sleep 0.1
done
sleep 2
after=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
wait $LG
per=$(( (after - before) * 1024 / SESSIONS ))
line="| $(date -u +%Y-%m-%dT%H:%MZ) | $SESSIONS | ${before} KiB | ${after} KiB | $per bytes |"
echo "$line"
{ echo; echo "### Idle WebSocket sessions: \`SESSIONS=$SESSIONS ACK=$ACK bash perf/idle_sessions.sh\`"; echo;
  echo "| when | sessions | RSS before | RSS with sessions | per session |"; echo "|---|---|---|---|---|"; echo "$line"; } >> perf/RESULTS.md
