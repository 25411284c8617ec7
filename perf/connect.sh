#!/usr/bin/env bash
# evmesh-connect's throughput and CPU per record: N lines written to a file before the run, a
# file source into evmesh, and out of evmesh either a file sink or a PostgreSQL sink (Debian's
# postgresql, started here in a temporary directory); and N records in a Kafka topic (tansu,
# memory storage, on its own port; filled before the run by evmesh-connect itself: file
# source -> evmesh -> Kafka sink, so each record is a CloudEvent in Kafka's binary binding), a
# Kafka source into evmesh and a file sink out. Measures, per run, the time from the
# connector process's start until the last record is in the sink, the records per second, and
# the CPU of evmesh-connect and of evmesh (/proc, user + system) per record. ROUNDS runs per
# pipeline, medians reported; the table is appended to perf/RESULTS.md, raw numbers in
# perf/results/connect-<stamp>/.
#
#   bash perf/connect.sh        (N=100000 ROUNDS=3 BATCH=500)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-100000}; ROUNDS=${ROUNDS:-3}; BATCH=${BATCH:-500}
PEERS=0 source perf/common.sh
CONNECT=${CONNECT:-$CARGO_TARGET_DIR/release/evmesh-connect}
OUT=$ROOT/perf/results/connect-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
WORK=$(mktemp -d /var/tmp/evmesh-connect-perf.XXXX); chmod 755 "$WORK"
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | head -1)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
  [ -d "$WORK/pg" ] && as_pg "$PGBIN/pg_ctl" -D "$WORK/pg/data" -m immediate stop >/dev/null 2>&1 || true
  kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/pg"; chown postgres:postgres "$WORK/pg" 2>/dev/null || true
as_pg "$PGBIN/initdb" -D "$WORK/pg/data" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$WORK/pg/data" -o "-p 18432 -k $WORK/pg -c listen_addresses=127.0.0.1" -l "$WORK/pg/log" -w start >/dev/null
PGURL=postgres://postgres@127.0.0.1:18432/postgres
TANSU=${EVMESH_TANSU:-/var/tmp/evmesh-tansu/tansu}
"$TANSU" broker --listener-url tcp://127.0.0.1:18492 --advertised-listener-url tcp://127.0.0.1:18492 \
  --storage-engine memory://tansu/ > "$WORK/tansu.log" 2>&1 &
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/18492) 2>/dev/null && break; sleep 0.1; done
KAFKA=127.0.0.1:18492
psql_q() { PGOPTIONS="-c client_min_messages=warning" psql -qtAX "$PGURL" -c "$1"; }

python3 - "$WORK/lines.jsonl" "$N" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"order": i, "sku": f"SKU-{i % 997}", "qty": i % 7 + 1, "note": "x" * 100}) + "\n")
PY
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# fill TOPIC: the N lines into Kafka topic TOPIC, through evmesh (file source, Kafka sink).
fill() {
  local dir=$WORK/fill-$1 ev cn
  mkdir -p "$dir/cfg"; cp "$WORK/lines.jsonl" "$dir/in.jsonl"
  "$TANSU" topic create "$1" --broker "tcp://$KAFKA" --partitions 1 > /dev/null
  "$EVMESH" serve --shards 1 --data-dir "$dir/evmesh" --listen 127.0.0.1:18580 --admin-listen 127.0.0.1:18581 > "$dir/evmesh.log" 2>&1 &
  ev=$!; wait_ready http://127.0.0.1:18581
  printf 'name = "in"\nkind = "source"\nconnector = "file"\ntopic = "fill"\nbatch = %s\n[config]\npath = "%s"\n' "$BATCH" "$dir/in.jsonl" > "$dir/cfg/in.toml"
  printf 'name = "out"\nkind = "sink"\nconnector = "kafka"\ntopic = "fill"\nsubscription = "fill"\nbatch = %s\n[config]\nbrokers = "%s"\ntopic = "%s"\n' "$BATCH" "$KAFKA" "$1" > "$dir/cfg/out.toml"
  "$CONNECT" --evmesh http://127.0.0.1:18580 --config-dir "$dir/cfg" --data-dir "$dir/data" --admin-listen 127.0.0.1:18590 > /dev/null 2> "$dir/connect.log" &
  cn=$!
  until [ "$(curl -s 127.0.0.1:18590/connectors/out | python3 -c 'import json,sys; print(json.load(sys.stdin)["counts"]["put"])' 2>/dev/null || echo 0)" -ge "$N" ]; do sleep 0.2; done
  kill "$cn" "$ev"; wait "$cn" "$ev" 2>/dev/null || true
  rm -rf "$dir"
}

# run NAME SINK [KAFKA_TOPIC]: one pipeline run; SINK is file or postgres; the source is the
# file, or KAFKA_TOPIC when given. Prints a JSON line.
run() {
  local name=$1 sink=$2 ktopic=${3:-} dir=$WORK/$1 ev cn t0 t1 done_n c0 e0
  mkdir -p "$dir/cfg"; cp "$WORK/lines.jsonl" "$dir/in.jsonl"
  "$EVMESH" serve --shards 1 --data-dir "$dir/evmesh" --listen 127.0.0.1:18580 --admin-listen 127.0.0.1:18581 > "$dir/evmesh.log" 2>&1 &
  ev=$!; wait_ready http://127.0.0.1:18581
  if [ -n "$ktopic" ]; then
    printf 'name = "in"\nkind = "source"\nconnector = "kafka"\ntopic = "orders"\nbatch = %s\n[config]\nbrokers = "%s"\ntopic = "%s"\n' "$BATCH" "$KAFKA" "$ktopic" > "$dir/cfg/in.toml"
  else
    printf 'name = "in"\nkind = "source"\nconnector = "file"\ntopic = "orders"\nbatch = %s\n[config]\npath = "%s"\n' "$BATCH" "$dir/in.jsonl" > "$dir/cfg/in.toml"
  fi
  if [ "$sink" = postgres ]; then
    psql_q "DROP TABLE IF EXISTS $name"
    printf 'name = "out"\nkind = "sink"\nconnector = "postgres"\ntopic = "orders"\nsubscription = "out"\nbatch = %s\n[config]\nurl = "%s"\ntable = "%s"\n' "$BATCH" "$PGURL" "$name" > "$dir/cfg/out.toml"
  else
    printf 'name = "out"\nkind = "sink"\nconnector = "file"\ntopic = "orders"\nsubscription = "out"\nbatch = %s\n[config]\npath = "%s"\n' "$BATCH" "$dir/out.jsonl" > "$dir/cfg/out.toml"
  fi
  e0=$(ticks "$ev"); t0=$(date +%s.%N)
  "$CONNECT" --evmesh http://127.0.0.1:18580 --config-dir "$dir/cfg" --data-dir "$dir/data" --admin-listen 127.0.0.1:18590 > /dev/null 2> "$dir/connect.log" &
  cn=$!
  while :; do
    if [ "$sink" = postgres ]; then done_n=$(psql_q "SELECT count(*) FROM $name" 2>/dev/null || echo 0)
    elif [ -f "$dir/out.jsonl" ]; then done_n=$(wc -l < "$dir/out.jsonl"); else done_n=0; fi
    [ "${done_n:-0}" -ge "$N" ] && break
    sleep 0.05
  done
  t1=$(date +%s.%N); c0=$(ticks "$cn"); e1=$(ticks "$ev")
  kill "$cn" "$ev"; wait "$cn" "$ev" 2>/dev/null || true
  python3 - "$name" "${ktopic:+kafka-}$sink" "$N" "$t0" "$t1" "$c0" "$e0" "$e1" "$(getconf CLK_TCK)" <<'PY' | tee -a "$OUT/runs.jsonl"
import json, sys
name, sink, n, t0, t1, c, e0, e1, tck = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
secs = t1 - t0
print(json.dumps({"run": name, "sink": sink, "records": n, "seconds": round(secs, 3), "records_per_s": round(n / secs),
                  "connect_cpu_us_per_record": round(c / tck * 1e6 / n, 2), "evmesh_cpu_us_per_record": round((e1 - e0) / tck * 1e6 / n, 2)}))
PY
  rm -rf "$dir"
}

for r in $(seq "$ROUNDS"); do
  run "file_r$r" file
  run "pg_r$r" postgres
  fill "perf-orders-$r"
  run "kafka_r$r" file "perf-orders-$r"
done

python3 - "$OUT" "$N" "$ROUNDS" "$BATCH" <<'PY' | tee "$OUT/summary.md"
import json, os, statistics as st, sys
out, n, rounds, batch = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
print(f"### evmesh-connect pipelines, {os.path.basename(out)}\n")
print(f"{n} JSON lines (~150 B) in a file (or as CloudEvents in a Kafka topic, tansu) before the run; source -> evmesh (1 shard) -> sink, batch {batch}; "
      f"from the connector's start to the last record in the sink; {rounds} runs each, medians. CPU from /proc "
      f"(the connector process runs source and sink; evmesh's is the broker's).\n")
print("| pipeline | records/s | connector CPU µs/record | evmesh CPU µs/record | per run (records/s) |")
print("|---|---|---|---|---|")
for sink, label in [("file", "file -> evmesh -> file"), ("postgres", "file -> evmesh -> PostgreSQL"), ("kafka-file", "Kafka -> evmesh -> file")]:
    rs = [r for r in runs if r["sink"] == sink]
    m = lambda k: st.median(r[k] for r in rs)
    print(f"| {label} | {m('records_per_s'):.0f} | {m('connect_cpu_us_per_record'):.2f} | {m('evmesh_cpu_us_per_record'):.2f} | "
          + ", ".join(str(r["records_per_s"]) for r in rs) + " |")
PY
{ echo; echo "Command: \`N=$N ROUNDS=$ROUNDS BATCH=$BATCH bash perf/connect.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
