#!/usr/bin/env bash
# Server memory per idle WebSocket session: SESSIONS subscribers attach to a BROADCAST
# subscription (ack=none; with ACK=1 acknowledged sessions, each its own consumer with
# delivery state on the partition owner; with SSE=1 server-sent event streams, which are
# acknowledged sessions acking over POST /events/ack, and nchan's EventSource subscribers beside them) while one event a second flows; RSS of the evmesh
# process is read from /proc before and with the sessions attached. Appends the figure to
# perf/RESULTS.md. Beside it, the same for nginx + nchan (its one worker's RSS, WebSocket
# subscribers of one channel; at most 8,000, its worker_connections is 8,192), unless NCHAN=0.
#
#   bash perf/idle_sessions.sh        (SESSIONS=10000 ACK=0 NCHAN=1 EVMESH_BIN= env knobs; raises the
#                                      open-files limit to what SESSIONS needs, perf/fdlimit.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
SESSIONS=${SESSIONS:-10000}; ACK=${ACK:-0}; SSE=${SSE:-0}
if [ "$ACK" = 1 ]; then QUERY="subscription=idle"; ACKFLAG=(--ack); else QUERY="subscription=idle&ack=none"; ACKFLAG=(); fi
SUB="ws://127.0.0.1:18480/events/ws?$QUERY"; NSUB="ws://127.0.0.1:18080/sub?id=idle"; KIND=WebSocket
# SSE streams are acknowledged sessions: they ack over POST /events/ack (the ids name the stream).
if [ "$SSE" = 1 ]; then SUB="http://127.0.0.1:18480/events/sse?subscription=idle"; NSUB="http://127.0.0.1:18080/sub?id=idle"; ACKFLAG=(--ack); KIND=SSE; fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/evmesh-target}"
source perf/fdlimit.sh
raise_fd_limit "$SESSIONS"
bash scripts/deps.sh
# EVMESH_BIN: another evmesh build to measure (this checkout's is built and used otherwise).
[ -n "${EVMESH_BIN:-}" ] || cargo build --release -q --workspace
EVMESH=${EVMESH_BIN:-$CARGO_TARGET_DIR/release/evmesh}; LOADGEN=$CARGO_TARGET_DIR/release/loadgen
DIR=$(mktemp -d /var/tmp/evmesh-idle.XXXX)
"$EVMESH" serve --shards 1 --data-dir "$DIR" --listen 127.0.0.1:18480 --admin-listen 127.0.0.1:18481 --max-connections $((SESSIONS + 100)) > "$DIR/evmesh.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do curl -sf http://127.0.0.1:18481/readyz >/dev/null && break; sleep 0.1; done
curl -sf 127.0.0.1:18480/events/subscribe -d '{"subscription":"idle","topic":"idle","mode":"BROADCAST"}' >/dev/null
before=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
"$LOADGEN" --url "http://127.0.0.1:18480/events/publish?topic=idle" --connections 1 --duration 8s --warmup 4s --rate 1 \
  --subscribe-url "$SUB" --subscribers "$SESSIONS" --server-pid "$PID" "${ACKFLAG[@]}" > "$DIR/loadgen.txt" &
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
line="| $(date -u +%Y-%m-%dT%H:%MZ) | evmesh | $SESSIONS | ${before} KiB | ${after} KiB | $per bytes |"
echo "$line"
nline=""
if [ "${NCHAN:-1}" != 0 ]; then
  P=${PEERS_DIR:-/tmp/evmesh-peers}; SHARED=${SHARED:-$PWD/../shared}
  if [ ! -f "$P/nchan/nginx.conf" ] || ! command -v nginx >/dev/null; then bash "$SHARED/peers/setup_peers.sh" install; fi
  # A fresh worker: one that served sessions before keeps their memory (its pools are reused,
  # not returned), which would hide these sessions' cost.
  if curl -sf http://127.0.0.1:18080/ok >/dev/null; then
    nginx -p "$P/nchan" -c "$P/nchan/nginx.conf" -s stop 2>/dev/null || true
    for _ in $(seq 50); do curl -sf http://127.0.0.1:18080/ok >/dev/null || break; sleep 0.1; done
  fi
  mkdir -p "$P/nchan/logs" "$P/nchan/tmp"; nginx -p "$P/nchan" -c "$P/nchan/nginx.conf" 2>&1 | grep -v '\[info\]' || true
  for _ in $(seq 50); do curl -sf http://127.0.0.1:18080/ok >/dev/null && break; sleep 0.1; done
  NPID=$(pgrep -P "$(cat "$P/nchan/nginx.pid")" | head -1)
  N=$(( SESSIONS < 8000 ? SESSIONS : 8000 ))
  nbefore=$(awk '/VmRSS/{print $2}' /proc/$NPID/status)
  "$LOADGEN" --url "http://127.0.0.1:18080/pub?id=idle" --connections 1 --duration 8s --warmup 4s --rate 1 \
    --subscribe-url "$NSUB" --subscribers "$N" --server-pid "$NPID" > "$DIR/loadgen-nchan.txt" &
  LG=$!
  # Divided by the connections open when read (the last few of 8,000 may not get in).
  for _ in $(seq 60); do
    open=$(ss -Htn state established '( sport = :18080 )' | wc -l)
    [ "$open" -ge $(( N * 95 / 100 )) ] && break; sleep 0.1
  done
  sleep 1
  nafter=$(awk '/VmRSS/{print $2}' /proc/$NPID/status)
  open=$(( $(ss -Htn state established '( sport = :18080 )' | wc -l) - 1 ))
  wait $LG
  nline="| $(date -u +%Y-%m-%dT%H:%MZ) | nginx + nchan | $open | ${nbefore} KiB | ${nafter} KiB | $(( (nafter - nbefore) * 1024 / open )) bytes |"
  echo "$nline"
fi
{ echo; echo "### Idle $KIND sessions: \`${EVMESH_BIN:+EVMESH_BIN=$EVMESH_BIN }SESSIONS=$SESSIONS ACK=$ACK SSE=$SSE bash perf/idle_sessions.sh\`"; echo;
  echo "| when | server | sessions | RSS before | RSS with sessions | per session |"; echo "|---|---|---|---|---|---|"; echo "$line";
  [ -z "$nline" ] || echo "$nline"; } >> perf/RESULTS.md
