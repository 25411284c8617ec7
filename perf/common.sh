# Sourced by the perf scripts: builds evmesh and loadgen, starts nginx + nchan from the shared
# peer scripts (installing them once; not with PEERS=0), and sets EVMESH, LOADGEN, NCHAN_PID,
# ROOT, P, SHARED. CARGO_TARGET_DIR picks the build directory, EVMESH_FEATURES cargo features
# of evmesh (rocketmq); EVMESH_BIN runs another evmesh
# binary than this checkout's (an older build, for a before/after).
#
# The broker measured is the deployed build, the `dist` profile (fat LTO, one codegen unit:
# Cargo.toml); the tools (loadgen) are the release build's. The dist build links the RocksDB
# library the release build compiled (ROCKSDB_LIB_DIR: the same C++, built with the same
# flags), so RocksDB compiles once.
ROOT=$PWD
SHARED=${SHARED:-$ROOT/../shared}
P=${PEERS_DIR:-/tmp/evmesh-peers}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/evmesh-target}"
bash scripts/deps.sh
cargo build --release -q --workspace ${EVMESH_FEATURES:+--features "evmesh/$EVMESH_FEATURES"} --bins
if [ -z "${EVMESH_BIN:-}" ]; then
  ROCKS_A=$(ls -t "$CARGO_TARGET_DIR"/release/build/librocksdb-sys-*/out/librocksdb.a 2>/dev/null | head -1 || true)
  env ${ROCKS_A:+ROCKSDB_LIB_DIR="$(dirname "$ROCKS_A")" ROCKSDB_STATIC=1} \
    cargo build --profile dist -q -p evmesh ${EVMESH_FEATURES:+--features "$EVMESH_FEATURES"} --bin evmesh
fi
EVMESH=${EVMESH_BIN:-$CARGO_TARGET_DIR/dist/evmesh}
LOADGEN=$CARGO_TARGET_DIR/release/loadgen
if [ "${PEERS:-1}" != 0 ]; then
  if [ ! -f "$P/nchan/nginx.conf" ] || ! command -v nginx >/dev/null; then bash "$SHARED/peers/setup_peers.sh" install; fi
  if ! curl -sf http://127.0.0.1:18080/ok >/dev/null; then
    mkdir -p "$P/nchan/logs" "$P/nchan/tmp"; nginx -p "$P/nchan" -c "$P/nchan/nginx.conf" 2>&1 | grep -v '\[info\]' || true
  fi
  for _ in $(seq 50); do curl -sf http://127.0.0.1:18080/ok >/dev/null && break; sleep 0.1; done
  NCHAN_PID=$(pgrep -P "$(cat "$P/nchan/nginx.pid")" | head -1)
fi

# wait_ready ADMIN_URL: until /readyz answers 200 (10 s at most).
wait_ready() {
  for _ in $(seq 100); do curl -sf "$1/readyz" >/dev/null && return 0; sleep 0.1; done
  echo "evmesh did not become ready" >&2; return 1
}

# ticks PID: the process's user + system CPU, in clock ticks (1/CLK_TCK s).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# wrk_run NAME URL PID [LUA]: `wrk -t1 -c$CONNS` for $DUR s after a 1 s warm-up, posting what
# LUA (default $OUT/.post.lua) says; writes $OUT/NAME.wrk.json with the throughput, the server's
# CPU µs per request (from /proc) and the non-2xx count, and appends wrk's report to $OUT/log.txt.
wrk_run() {
  local before after out lua=${4:-$OUT/.post.lua}
  wrk -t1 -c"$CONNS" -d1s -s "$lua" "$2" > /dev/null
  before=$(ticks "$3"); out=$(wrk -t1 -c"$CONNS" -d"${DUR}s" -s "$lua" "$2"); after=$(ticks "$3")
  echo "$out" >> "$OUT/log.txt"
  python3 - "$OUT/$1.wrk.json" "$before" "$after" "$(getconf CLK_TCK)" "$out" <<'PY'
import json, re, sys
path, before, after, tck, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
n = int(re.search(r"(\d+) requests in", out).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
r = {"throughput": rate, "server_cpu_us_per_op": (after - before) * 1e6 / tck / max(n, 1),
     "errors": int(bad.group(1)) if bad else 0}
lat = re.search(r"LAT (\d+) (\d+) (\d+)", out)
if lat:
    r.update(zip(["p50_us", "p99_us", "p999_us"], map(int, lat.groups())))
json.dump(r, open(path, "w"))
PY
}

# post_lua FILE [TOKEN]: the wrk script posting the same 1 KiB structured event as loadgen, with
# an Authorization header if TOKEN is set.
post_lua() {
  python3 - "$1" "${2:-}" <<'PY'
import json, sys
event = {"specversion": "1.0", "id": "wrk", "source": "/perf", "type": "perf.event", "data": "x" * 900}
s = 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/cloudevents+json"\n'
if sys.argv[2]:
    s += f'wrk.headers["Authorization"] = "Bearer {sys.argv[2]}"\n'
s += f"wrk.body = {json.dumps(json.dumps(event))}\n"
# Latency percentiles in µs, p99.9 included (wrk's own report stops at p99).
s += 'done = function(summary, latency, requests)\n'
s += '  io.write(string.format("LAT %d %d %d\\n", latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))\n'
s += 'end\n'
open(sys.argv[1], "w").write(s)
PY
}

# token_files DIR TOKEN: a tokens file naming TOKEN for principal perf-svc, and evmesh.toml
# with one ACL rule letting perf-* publish to topic perf (what the auth benchmarks run with).
token_files() {
  printf '{"principal": "perf-svc", "sha256": "%s"}\n' "$(printf %s "$2" | sha256sum | cut -d' ' -f1)" > "$1/tokens.jsonl"
  printf '[[acl]]\nid = "perf"\nprincipal = "perf-*"\nresource = "topic:perf"\nactions = ["PUBLISH"]\neffect = "ALLOW"\n' > "$1/evmesh.toml"
}

# test_certificate DIR: a CA of the run's own (ca.pem) and an ECDSA P-256 certificate it issued
# for localhost and 127.0.0.1 (server.pem, server.key), for the TLS benchmarks.
test_certificate() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=perf-ca \
    -keyout "$1/ca.key" -out "$1/ca.pem" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
    -keyout "$1/server.key" -out "$1/server.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$1/ext"
  openssl x509 -req -in "$1/server.csr" -CA "$1/ca.pem" -CAkey "$1/ca.key" -CAcreateserial -days 2 \
    -extfile "$1/ext" -out "$1/server.pem" 2>/dev/null
}

# start_broker DIR [FLAGS...]: one shard on core 0 at 127.0.0.1:18180 (admin :18181), logging to
# $OUT/evmesh.log, until ready; sets pid. stop_broker DIR: stops it and removes DIR.
start_broker() {
  local dir=$1; shift
  taskset -c 0 "$EVMESH" serve --shards 1 --data-dir "$dir" "$@" \
    --listen 127.0.0.1:18180 --admin-listen 127.0.0.1:18181 > "$OUT/evmesh.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18181
}
stop_broker() { kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$1"; sleep 0.5; }
# keepalive_publish N [NAME=VALUE ...]: N keep-alive publishes of the 1 KiB event to the broker
# at 127.0.0.1:18380 (topic perf), with these extra request headers, each answered 202 (else
# exit 1). What the instruction-count scripts count.
keepalive_publish() {
  python3 - "$@" <<'PY'
import http.client, json, sys
n = int(sys.argv[1])
event = json.dumps({"specversion": "1.0", "id": "i", "source": "/perf", "type": "perf.event", "data": "x" * 900})
headers = {"content-type": "application/cloudevents+json"}
headers.update(h.split("=", 1) for h in sys.argv[2:])
c = http.client.HTTPConnection("127.0.0.1", 18380, timeout=120)
for _ in range(n):
    c.request("POST", "/events/publish?topic=perf", body=event, headers=headers)
    r = c.getresponse(); r.read()
    if r.status != 202:
        sys.exit(f"publish answered {r.status}")
PY
}

# start_evmesh DRIVER DURABILITY [BINARY [FLAGS...]]: one evmesh (SHARDS shards, default 1) on the perf
# ports 18180/18181, its data in a fresh directory, its log in $OUT; sets EV_PID. stop_evmesh
# ends it and removes the data.
EV_PID=
start_evmesh() {
  local dir; dir=$(mktemp -d /var/tmp/evmesh-perf.XXXX)
  "${3:-$EVMESH}" serve --shards "${SHARDS:-1}" --io-driver "$1" --durability "$2" --data-dir "$dir" \
    --listen 127.0.0.1:18180 --admin-listen 127.0.0.1:18181 "${@:4}" > "$OUT/evmesh.log" 2>&1 &
  EV_PID=$!; EV_DIR=$dir
  wait_ready http://127.0.0.1:18181 || { cat "$OUT/evmesh.log" >&2; exit 1; }
}
stop_evmesh() { kill "$EV_PID" 2>/dev/null; wait "$EV_PID" 2>/dev/null || true; rm -rf "$EV_DIR"; }
