#!/usr/bin/env bash
# Server memory per idle WebSocket session, plain and over TLS, in the same run: SESSIONS
# Python `websockets` clients (ws:// then wss://, verifying the run's own CA) attach to a
# BROADCAST subscription with ack=none and stay idle; the evmesh process's RSS is read from
# /proc before and with them attached. Appends the figures to perf/RESULTS.md.
#
#   bash perf/tls_idle_sessions.sh        (SESSIONS=2000)
set -euo pipefail
cd "$(dirname "$0")/.."
SESSIONS=${SESSIONS:-2000}
PEERS=0 source perf/common.sh
VENV=${VENV:-/var/tmp/evmesh-venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c 'import websockets' 2>/dev/null || "$VENV/bin/pip" install -q websockets==15.0.1
WORK=$(mktemp -d /var/tmp/evmesh-tls-idle.XXXX); pid=; cp=
trap 'kill $pid $cp 2>/dev/null; rm -rf "$WORK"' EXIT
test_certificate "$WORK"
cat > "$WORK/idle.py" <<'PY'
import asyncio, ssl, sys
import websockets
url, n, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = None
if url.startswith("wss:"):
    ctx = ssl.create_default_context(cafile=ca)
async def main():
    conns = []
    for i in range(0, n, 100):
        conns += await asyncio.gather(*(websockets.connect(url, ssl=ctx, ping_interval=None, max_queue=None)
                                        for _ in range(min(100, n - i))))
    print("attached", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
PY
rss() { awk '/VmRSS/{print $2}' "/proc/$1/status"; }
results=()
for mode in plain tls; do
  dir=$(mktemp -d /var/tmp/evmesh-tls-idle-data.XXXX)
  flags=(); scheme=http; ws=ws
  [ "$mode" = tls ] && { flags=(--tls-cert "$WORK/server.pem" --tls-key "$WORK/server.key"); scheme=https; ws=wss; }
  "$EVMESH" serve --shards 1 --data-dir "$dir" --listen 127.0.0.1:18580 --admin-listen 127.0.0.1:18581 \
    --max-connections $((SESSIONS + 100)) "${flags[@]}" > "$dir/evmesh.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -sfk "$scheme://127.0.0.1:18581/readyz" >/dev/null && break; sleep 0.1; done
  curl -sfk "$scheme://127.0.0.1:18580/events/subscribe" -d '{"subscription":"idle","topic":"idle","mode":"BROADCAST"}' >/dev/null
  before=$(rss "$pid")
  "$VENV/bin/python" "$WORK/idle.py" "$ws://localhost:18580/events/ws?subscription=idle&ack=none" "$SESSIONS" "$WORK/ca.pem" \
    > "$dir/clients.txt" 2>&1 &
  cp=$!
  for _ in $(seq 600); do grep -q attached "$dir/clients.txt" 2>/dev/null && break; sleep 0.1; done
  grep -q attached "$dir/clients.txt" || { cat "$dir/clients.txt" >&2; exit 1; }
  sleep 2
  after=$(rss "$pid")
  kill "$cp" 2>/dev/null || true; wait "$cp" 2>/dev/null || true
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
  results+=("| $mode | $SESSIONS | ${before} KiB | ${after} KiB | $(( (after - before) * 1024 / SESSIONS )) bytes |")
done
{ echo; echo "### Idle WebSocket sessions, plain and TLS: \`SESSIONS=$SESSIONS bash perf/tls_idle_sessions.sh\` ($(date -u +%Y-%m-%dT%H:%MZ))"; echo;
  echo "Python websockets clients, BROADCAST ack=none, 1 shard; TLS 1.3, ECDSA P-256."; echo;
  echo "| transport | sessions | RSS before | RSS with sessions | per session |"; echo "|---|---|---|---|---|";
  printf '%s\n' "${results[@]}"; } | tee -a perf/RESULTS.md
