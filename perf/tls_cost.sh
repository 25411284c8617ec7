#!/usr/bin/env bash
# What TLS costs per keep-alive publish, beside nginx + nchan under the same load: evmesh plain
# and over TLS, nginx + nchan plain and over TLS (both with the same ECDSA P-256 certificate,
# TLS 1.3), in alternation:
#
#   bash perf/tls_cost.sh        (ROUNDS=3 DUR=10 CONNS=64 DRIVER=epoll)
#
# Closed loop, `wrk -t1 -c$CONNS` (loadgen speaks no TLS) posting the same 1 KiB event: to
# evmesh's /events/publish (1 shard, auth = none, durability os) and to nchan's publisher
# location (one nginx worker, the channel with no subscribers). Server CPU from /proc (nginx:
# its worker). The table gives each server's median CPU µs per publish, what TLS adds to it in
# the same rounds, throughput and latency percentiles. Raw reports in
# perf/results/tls-cost-<stamp>/; the table is appended to RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-10}; CONNS=${CONNS:-64}; DRIVER=${DRIVER:-epoll}
source perf/common.sh
OUT=$ROOT/perf/results/tls-cost-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
WORK=$(mktemp -d /var/tmp/evmesh-tls.XXXX)
cleanup() { [ -f "$WORK/nginx/nginx.pid" ] && kill "$(cat "$WORK/nginx/nginx.pid")" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
# One certificate for both servers: a CA of the run's own and a leaf for 127.0.0.1.
test_certificate "$WORK"
# nginx + nchan with a plain and a TLS listener on the same publisher location.
mkdir -p "$WORK/nginx/logs" "$WORK/nginx/tmp"
cat > "$WORK/nginx/nginx.conf" <<EOF
load_module /usr/share/nginx/modules/ngx_nchan_module.so;
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
daemon on;
events { worker_connections 8192; multi_accept on; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/tmp/body;
    proxy_temp_path $WORK/nginx/tmp/proxy;
    fastcgi_temp_path $WORK/nginx/tmp/fcgi;
    uwsgi_temp_path $WORK/nginx/tmp/uwsgi;
    scgi_temp_path $WORK/nginx/tmp/scgi;
    keepalive_requests 1000000;
    client_body_buffer_size 64k;
    nchan_shared_memory_size 256M;
    ssl_protocols TLSv1.3;
    ssl_certificate $WORK/server.pem;
    ssl_certificate_key $WORK/server.key;
    server {
        listen 127.0.0.1:18290;
        listen 127.0.0.1:18293 ssl;
        location = /pub { nchan_publisher http; nchan_channel_id \$arg_id; nchan_message_buffer_length 1000; }
    }
}
EOF
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf"
for _ in $(seq 50); do [ -f "$WORK/nginx/nginx.pid" ] && break; sleep 0.1; done
NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx/nginx.pid")" | head -1)
post_lua "$OUT/.post.lua"
for r in $(seq "$ROUNDS"); do
  for tls in plain tls; do
    dir=$(mktemp -d /var/tmp/evmesh-tls-data.XXXX)
    flags=(); scheme=http
    [ "$tls" = tls ] && { flags=(--tls-cert "$WORK/server.pem" --tls-key "$WORK/server.key"); scheme=https; }
    "$EVMESH" serve --shards 1 --io-driver "$DRIVER" --data-dir "$dir" --listen 127.0.0.1:18280 \
      --admin-listen 127.0.0.1:18281 "${flags[@]}" > "$OUT/evmesh.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do curl -sfk "$scheme://127.0.0.1:18281/readyz" >/dev/null && break; sleep 0.1; done
    wrk_run "r$r-evmesh-$tls" "$scheme://127.0.0.1:18280/events/publish?topic=perf" "$pid" "$OUT/.post.lua"
    kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
    port=18290; [ "$tls" = tls ] && port=18293
    wrk_run "r$r-nchan-$tls" "$scheme://127.0.0.1:$port/pub?id=perf" "$NGINX_WORKER" "$OUT/.post.lua"
  done
done
rm -f "$OUT/.post.lua"

python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" "$DRIVER" <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, statistics as st
out, rounds, dur, conns, driver = sys.argv[1:]
def runs(name):
    return [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r*-{name}.wrk.json"))]
def med(name, key):
    return st.median(r[key] for r in runs(name))
print(f"### TLS cost per publish beside nginx + nchan, {os.path.basename(out)}\n")
print(f"wrk -t1 -c{conns} keep-alive, closed loop, 1 KiB event, {dur}s per run after 1s warm-up, {rounds} rounds "
      f"with the four servers in alternation. evmesh: 1 shard, {driver}, auth = none, durability os. nginx + "
      f"nchan: 1 worker, channel without subscribers. TLS 1.3, ECDSA P-256, the same certificate. CPU is the "
      f"server's, from /proc. Errors must be 0.\n")
print("| server | throughput (req/s) | CPU µs/publish | per round | TLS adds (µs) | p50 / p99 / p99.9 (µs) | errors |")
print("|---|---|---|---|---|---|---|")
for server in ["evmesh", "nchan"]:
    base = med(f"{server}-plain", "server_cpu_us_per_op")
    for tls in ["plain", "tls"]:
        name = f"{server}-{tls}"
        cpu = med(name, "server_cpu_us_per_op")
        per = ", ".join(f"{r['server_cpu_us_per_op']:.2f}" for r in runs(name))
        lat = " / ".join(f"{med(name, k):.0f}" for k in ["p50_us", "p99_us", "p999_us"])
        errs = sum(r.get("errors", 0) for r in runs(name))
        add = f"{cpu - base:+.2f}" if tls == "tls" else ""
        print(f"| {name} | {med(name, 'throughput'):.0f} | {cpu:.2f} | {per} | {add} | {lat} | {errs} |")
e, n = med("evmesh-tls", "server_cpu_us_per_op"), med("nchan-tls", "server_cpu_us_per_op")
print(f"\nOver TLS, evmesh uses {e / n:.2f}x the CPU per publish of nginx + nchan (median of the rounds).\n")
PY
{ echo; echo "Command: \`ROUNDS=$ROUNDS DUR=$DUR CONNS=$CONNS DRIVER=$DRIVER bash perf/tls_cost.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
