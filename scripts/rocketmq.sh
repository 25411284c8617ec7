#!/usr/bin/env bash
# The RocketMQ test broker for the RocketMQ backend: the Rust implementation's name server and
# broker (crates rocketmq-namesrv and rocketmq-broker 1.0.0, Apache-2.0), built once into
# /var/tmp/evmesh-rocketmq (outside the clone, reused), run on free loopback ports with all
# their files in one directory.
#
#   scripts/rocketmq.sh install        build the binaries if they are missing
#   scripts/rocketmq.sh start DIR      start a name server and a broker in DIR; prints the name
#                                      server's HOST:PORT once the broker is registered with it
#   scripts/rocketmq.sh broker DIR     (re)start DIR's broker alone, on the ports it had
#   scripts/rocketmq.sh stop DIR       stop both
set -euo pipefail
ROOT=/var/tmp/evmesh-rocketmq
BIN="$ROOT/bin"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# The broker binds its port, the port 2 below it and an HA port: three free ones, the first two
# apart. Taken below the kernel's ephemeral range where it can be: a load test run just before
# leaves thousands of its connections' local ports there (closing, or in TIME_WAIT), and three
# such ports with that spacing could not be found (a CI run after 50,000 idle sessions).
broker_ports() {
  python3 - <<'PY' || { echo "no free ports for the broker" >&2; exit 1; }
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
first, last = (max(1102, low - 12000), low - 2) if low > 4000 else (1102, 65533)
for _ in range(200):
    p = random.randrange(first, last + 1)
    try:
        for q in (p, p - 2, p + 1):
            # As a listener binds (SO_REUSEADDR): a port in TIME_WAIT is free for it.
            s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", q)); s.close()
    except OSError:
        continue
    print(p)
    break
else:
    raise SystemExit(1)
PY
}
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

case "${1:-}" in
install)
  # Unoptimised and without debug info: what a test broker needs, and what a cold CI run can
  # afford (4.4 minutes on 2 cores, where a release build took 24; perf/RESULTS.md).
  # INSTALL_ROOT builds elsewhere (to time a cold install).
  ROOT=${INSTALL_ROOT:-$ROOT}; BIN="$ROOT/bin"
  if [ ! -x "$BIN/rocketmq-broker-rust" ] || [ ! -x "$BIN/rocketmq-namesrv-rust" ]; then
    CARGO_TARGET_DIR=$ROOT-build CARGO_PROFILE_DEV_DEBUG=0 cargo install -q --locked --debug --root "$ROOT" \
      rocketmq-namesrv@1.0.0 rocketmq-broker@1.0.0
    rm -rf "$ROOT-build"
  fi
  ;;
start)
  dir=$2; mkdir -p "$dir/namesrv" "$dir/store" "$dir/auth"
  ns=$(free_port)
  cat > "$dir/namesrv.toml" <<EOF
rocketmqHome = "$dir"
kvConfigPath = "$dir/namesrv/kvConfig.json"
configStorePath = "$dir/namesrv/namesrv.properties"
listenPort = $ns
bindAddress = "127.0.0.1"
EOF
  bp=$(broker_ports)
  cat > "$dir/broker.toml" <<EOF
[broker]
brokerIp1 = "127.0.0.1"
brokerIp2 = "127.0.0.1"
listenPort = $bp
namesrvAddr = "127.0.0.1:$ns"
storePathRootDir = "$dir/store"
authConfigPath = "$dir/auth"
autoCreateTopicEnable = false
autoCreateSubscriptionGroup = true

[broker.brokerServerConfig]
bindAddress = "127.0.0.1"

[broker.brokerIdentity]
brokerName = "broker-a"
brokerClusterName = "DefaultCluster"
brokerId = 0

[store]
brokerRole = "ASYNC_MASTER"
flushDiskType = "ASYNC_FLUSH"
storePathRootDir = "$dir/store"
haListenAddress = "127.0.0.1"
haListenPort = $((bp + 1))
mappedFileSizeCommitLog = 67108864
messageIndexEnable = false
# A test broker's store is a few megabytes: it must not refuse writes because the machine's disk
# is 90% full (its default; a CI run failed so), nor clean up because it is 75% full.
diskMaxUsedSpaceRatio = 97
diskSpaceCleanForciblyRatio = 98
diskSpaceWarningLevelRatio = 99
EOF
  echo "127.0.0.1:$ns" > "$dir/namesrv.addr"; echo "$bp" > "$dir/broker.port"
  env -u NAMESRV_ADDR ROCKETMQ_HOME="$dir" ROCKETMQ_SHUTDOWN_TIMEOUT_SECONDS=2 \
    setsid "$BIN/rocketmq-namesrv-rust" -c "$dir/namesrv.toml" > "$dir/namesrv.log" 2>&1 < /dev/null &
  echo $! > "$dir/namesrv.pid"
  for _ in $(seq 200); do up "$ns" && break; sleep 0.05; done
  up "$ns" || { echo "the name server did not start; see $dir/namesrv.log" >&2; exit 1; }
  # A broker that does not start takes its name server with it (nothing is left running).
  bash "$0" broker "$dir" || { kill -9 "$(cat "$dir/namesrv.pid")" 2>/dev/null; exit 1; }
  cat "$dir/namesrv.addr"
  ;;
broker)
  dir=$2; bp=$(cat "$dir/broker.port"); ns=$(cat "$dir/namesrv.addr")
  health=$(free_port)
  env -u NAMESRV_ADDR ROCKETMQ_HOME="$dir" ROCKETMQ_SHUTDOWN_TIMEOUT_SECONDS=2 \
    ROCKETMQ_HEALTH_BIND_ADDR="127.0.0.1:$health" \
    setsid "$BIN/rocketmq-broker-rust" -c "$dir/broker.toml" -n "$ns" >> "$dir/broker.log" 2>&1 < /dev/null &
  echo $! > "$dir/broker.pid"
  # Ready: listening and registered with the name server.
  for _ in $(seq 600); do
    python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$health/readyz', timeout=1).status == 200 else 1)" \
      2>/dev/null && exit 0
    kill -0 "$(cat "$dir/broker.pid")" 2>/dev/null || break
    sleep 0.1
  done
  echo "the broker did not start; see $dir/broker.log" >&2; exit 1
  ;;
stop)
  dir=$2
  for p in broker namesrv; do [ -f "$dir/$p.pid" ] && kill -9 "$(cat "$dir/$p.pid")" 2>/dev/null || true; done
  ;;
*) echo "usage: $0 install | start DIR | broker DIR | stop DIR" >&2; exit 2 ;;
esac
