# Sourced by the scripts that measure several instances over one Kafka-protocol broker
# (perf/cluster.sh, perf/amplification.sh), after perf/common.sh: tansu (memory storage) on a
# free loopback port, stopped on exit with whatever instances are running. Needs what
# scripts/test.sh installs (tansu and the venv's websockets and httpx). Sets VENV, KP.
VENV=/var/tmp/evmesh-venv; TANSU=/var/tmp/evmesh-tansu/tansu
[ -x "$TANSU" ] && "$VENV/bin/python" -c 'import websockets, httpx' 2>/dev/null ||
  { echo "run scripts/test.sh once first: it installs tansu and the Python packages this uses" >&2; exit 1; }
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
KP=$(free_port)
"$TANSU" broker --listener-url "tcp://127.0.0.1:$KP" --advertised-listener-url "tcp://127.0.0.1:$KP" \
  --storage-engine memory://tansu/ > /dev/null 2>&1 &
TP=$!
pids=(); dirs=()
cleanup() { kill "${pids[@]}" "$TP" 2>/dev/null || true; rm -rf "${dirs[@]}"; }
trap cleanup EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$KP") 2>/dev/null && break; sleep 0.1; done

# start_three PREFIX LOG: three instances (1 shard each) over the broker with topic prefix
# PREFIX, logs to LOG-i1.log.. (or /dev/null), once each sees all three and has read the
# claims. Sets pids, urls, admins, dirs.
start_three() {
  pids=(); urls=(); admins=()
  for i in 1 2 3; do
    local port aport dir log=/dev/null
    port=$(free_port); aport=$(free_port); dir=$(mktemp -d /var/tmp/evmesh-cluster.XXXX); dirs+=("$dir")
    [ -n "${2:-}" ] && log="$2-i$i.log"
    "$EVMESH" serve --shards 1 --data-dir "$dir" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$aport" \
      --storage kafka --kafka-brokers "127.0.0.1:$KP" --kafka-topic-prefix "$1" > "$log" 2>&1 &
    pids+=($!); urls+=("http://127.0.0.1:$port"); admins+=("http://127.0.0.1:$aport")
  done
  for a in "${admins[@]}"; do
    wait_ready "$a"
    for _ in $(seq 200); do
      [ "$(curl -sf "$a/admin/cluster" | "$VENV/bin/python" -c 'import json,sys; v=json.load(sys.stdin); print(len(v["instances"]), v.get("claimsRead"))')" = "3 True" ] && break
      sleep 0.1
    done
  done
}

# stop_three: stops the instances start_three started and removes their data.
stop_three() {
  kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true
  rm -rf "${dirs[@]}"; dirs=(); pids=()
}
