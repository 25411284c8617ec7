#!/usr/bin/env bash
# Runs the broker on the embedded default (127.0.0.1:8080, admin 127.0.0.1:8081, ./data).
# Extra arguments go to `evmesh serve`, e.g. scripts/run.sh --durability fsync; EVMESH_FEATURES
# names cargo features to build with (EVMESH_FEATURES=rocketmq for storage = rocketmq).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/evmesh-target}"
exec cargo run --release ${EVMESH_FEATURES:+--features "$EVMESH_FEATURES"} --bin evmesh -- serve "$@"
