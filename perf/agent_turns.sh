#!/usr/bin/env bash
# Agent streaming calls (Mode 1): one agent attached over GET /agent/ws, SESSIONS sessions each
# streaming one long turn (POST /session/stream/{sid}, SSE), the agent sending chunks of a
# 17-byte stamp at RATE/s in all (open loop, `loadgen --turns`). Reports chunk latency from the
# agent's write to the client's read (p50/p99/p99.9) and the broker's CPU-µs per chunk; then
# memory per idle session: IDLE sessions opened (no turn), the broker's resident set before and
# with them. Appends to perf/RESULTS.md.
#
#   bash perf/agent_turns.sh     (ROUNDS=3 DUR=8 SESSIONS=64 RATES="1000 5000" IDLE=20000)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-8}; SESSIONS=${SESSIONS:-64}; RATES=${RATES-1000 5000}; IDLE=${IDLE:-20000}
PEERS=0 source perf/common.sh
OUT=$ROOT/perf/results/agent-turns-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
for rate in $RATES; do
  for r in $(seq "$ROUNDS"); do
    dir=$(mktemp -d /var/tmp/evmesh-turns.XXXX); start_broker "$dir" --max-sessions $(( IDLE + 1000 ))
    taskset -c 1 "$LOADGEN" --turns --url http://127.0.0.1:18180 --sessions "$SESSIONS" --rate "$rate" \
      --duration "${DUR}s" --warmup 2s --server-pid "$pid" --json "$OUT/$rate-r$r.json" | tee -a "$OUT/log.txt"
    stop_broker "$dir"
  done
done
# Idle sessions: opened, never streamed.
dir=$(mktemp -d /var/tmp/evmesh-turns.XXXX); start_broker "$dir" --max-sessions $(( IDLE + 1000 ))
curl -sf 127.0.0.1:18180/agent/register -d '{"agentId":"idle"}' > /dev/null
sleep 1; before=$(awk '/VmRSS/{print $2 * 1024}' "/proc/$pid/status")
python3 - "$IDLE" <<'PY'
import socket, sys
n = int(sys.argv[1]); s = socket.create_connection(("127.0.0.1", 18180)); f = s.makefile("rb")
body = b'{"clientId":"idle","agentId":"idle"}'
req = b"POST /session/open HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
for start in range(0, n, 500):
    k = min(n, start + 500) - start
    s.sendall(req * k)
    for _ in range(k):
        assert f.readline().split()[1] == b"201"
        length = 0
        while (line := f.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        f.read(length)
PY
sleep 2; after=$(awk '/VmRSS/{print $2 * 1024}' "/proc/$pid/status")
open=$(curl -sf 127.0.0.1:18181/metrics | awk '/^evmesh_stream_sessions /{print $2}')
stop_broker "$dir"
python3 - "$OUT" "$ROUNDS" "$DUR" "$SESSIONS" "$IDLE" "$before" "$after" "$open" $RATES <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, statistics as st
out, rounds, dur, sessions, idle, before, after, opened, *rates = sys.argv[1:]
print(f"### agent streaming calls, {os.path.basename(out)}\n")
print(f"One agent (GET /agent/ws), {sessions} sessions each streaming one turn (POST /session/stream, SSE), the agent "
      f"sending chunks (WebSocket chunk frames, 17-byte data) round robin at the rate shown in all, {dur}s per run "
      f"after 2s warm-up, {rounds} rounds; evmesh shards=1, on core 0, loadgen on core 1. Latency: the agent's "
      f"write to the client's read.\n")
print("| chunks/s | read/s (median) | chunk latency p50 / p99 / p99.9 µs (median) | server CPU µs per chunk (median; per round) |")
print("|---|---|---|---|")
for rate in rates:
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{rate}-r*.json"))]
    lat = lambda k: int(st.median([x["chunk_latency_us"][k] for x in runs]))
    cpu = [x["server_cpu_us_per_chunk"] for x in runs if x["server_cpu_us_per_chunk"]]
    print(f"| {rate} | {int(st.median([x['chunks_per_s'] for x in runs]))} | {lat('p50')} / {lat('p99')} / {lat('p999')} | "
          f"{st.median(cpu):.1f} ({', '.join(f'{v:.1f}' for v in cpu)}) |")
per = (int(after) - int(before)) / int(idle)
print(f"\nIdle sessions: {idle} opened ({opened} open per evmesh_stream_sessions), no turn: resident set "
      f"{int(before) // 1024} KiB -> {int(after) // 1024} KiB, **{per:,.0f} bytes per idle session** (its table entry, "
      f"ids and empty turn log).")
PY
{ echo; echo "Command: \`ROUNDS=$ROUNDS DUR=$DUR SESSIONS=$SESSIONS RATES=\"$RATES\" IDLE=$IDLE bash perf/agent_turns.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
