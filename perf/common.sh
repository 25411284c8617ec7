# Sourced by the perf scripts: builds evmesh and loadgen, starts nginx + nchan from the shared
# peer scripts (installing them once; not with PEERS=0), and sets EVMESH, LOADGEN, NCHAN_PID,
# ROOT, P, SHARED. CARGO_TARGET_DIR picks the build directory.
ROOT=$PWD
SHARED=${SHARED:-$ROOT/../shared}
P=${PEERS_DIR:-/tmp/evmesh-peers}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/evmesh-target}"
bash scripts/deps.sh
cargo build --release -q --workspace --bins
EVMESH=$CARGO_TARGET_DIR/release/evmesh
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
