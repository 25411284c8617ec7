#!/usr/bin/env bash
# WebSocket conformance: the Autobahn cases (../shared/peers/conformance_ws.sh, kosoku) against
# evmesh's echo endpoint, which exists only with ws_echo_endpoint = true. permessage-deflate is
# not implemented, so sections 12.* and 13.* are excluded. Appends the summary to perf/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-$PWD/../shared}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/evmesh-target}"
bash scripts/deps.sh
cargo build --release -q --workspace --bins
DIR=$(mktemp -d /var/tmp/evmesh-autobahn.XXXX)
"$CARGO_TARGET_DIR/release/evmesh" serve --shards 1 --data-dir "$DIR" --listen 127.0.0.1:18280 --admin-listen 127.0.0.1:18281 \
  --ws-echo-endpoint true --ws-max-message-bytes 67108864 > "$DIR/evmesh.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do curl -sf http://127.0.0.1:18281/readyz >/dev/null && break; sleep 0.1; done
set +e
bash "$SHARED/peers/conformance_ws.sh" ws://127.0.0.1:18280/ws/echo -x '12.*' -x '13.*' | tee "$DIR/autobahn.txt"
rc=${PIPESTATUS[0]}
set -e
{ echo; echo "### Autobahn (kosoku) against /ws/echo, $(date -u +%Y-%m-%dT%H:%MZ)"; echo;
  echo "Command: \`bash perf/autobahn.sh\` (sections 12.* and 13.* excluded: no permessage-deflate); exit code $rc"; echo;
  echo '```'; tail -5 "$DIR/autobahn.txt"; echo '```'; } >> perf/RESULTS.md
exit $rc
