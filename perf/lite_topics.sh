#!/usr/bin/env bash
# The cost of idle lite topics: one ~200-byte event published to each of N lite topics
# (session.<i>), then left idle; the broker's resident memory and its data directory measured
# before and after, per lite topic, beside the same for REGULAR regular topics (each created by
# its first event, default partitions), and beside the same events published to one topic: what
# is left over is the cost of the topics themselves. Appends a table to perf/RESULTS.md.
#
#   bash perf/lite_topics.sh     (COUNTS="100000 1000000" REGULAR=10000 SHARDS=2)
set -euo pipefail
cd "$(dirname "$0")/.."
COUNTS=${COUNTS:-100000 1000000}; REGULAR=${REGULAR:-10000}; SHARDS=${SHARDS:-2}
PEERS=0 source perf/common.sh
OUT=$ROOT/perf/results/lite-topics-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
rss() { awk '/VmRSS/ {print $2 * 1024}' "/proc/$1/status"; }
measure() { # name prefix n [same]: one run on a fresh broker; writes NAME.json
  local dir pid before after disk0 disk1 t0 t1
  dir=$(mktemp -d /var/tmp/evmesh-lite.XXXX)
  "$EVMESH" serve --shards "$SHARDS" --data-dir "$dir" --max-topics $(( REGULAR + 10 )) \
    --listen 127.0.0.1:18180 --admin-listen 127.0.0.1:18181 > "$OUT/evmesh.log" 2>&1 &
  pid=$!
  wait_ready http://127.0.0.1:18181
  python3 perf/lite_topics.py 127.0.0.1:18180 session.warm 1000   # warm up: allocator, memtables
  sleep 1; before=$(rss "$pid"); disk0=$(du -sb "$dir" | cut -f1)
  t0=$(date +%s.%N)
  python3 perf/lite_topics.py 127.0.0.1:18180 "$2" "$3" ${4:-}
  t1=$(date +%s.%N)
  sleep 3; after=$(rss "$pid"); disk1=$(du -sb "$dir" | cut -f1)
  python3 -c "import json,sys; a=sys.argv; json.dump({'name':a[1],'n':int(a[2]),'rss_before':int(a[3]),'rss_after':int(a[4]),'disk_before':int(a[5]),'disk_after':int(a[6]),'secs':float(a[8])-float(a[7])}, open(a[9],'w'))" \
    "$1" "$3" "$before" "$after" "$disk0" "$disk1" "$t0" "$t1" "$OUT/$1.json"
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"; sleep 0.5
}
measure "regular-$REGULAR" "topic-" "$REGULAR"
measure "one-$REGULAR" "topic-one" "$REGULAR" same
for n in $COUNTS; do
  measure "lite-$n" "session.s" "$n"
  measure "one-$n" "session.one" "$n" same
done
python3 - "$OUT" "$SHARDS" <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os
out, shards = sys.argv[1:]
print(f"### idle lite topics, {os.path.basename(out)}\n")
print(f"One ~200-byte structured event published to each topic (pipelined over one connection), then idle 3 s; "
      f"evmesh shards={shards}, durability os. Memory = resident set growth (VmRSS); disk = growth of the data "
      f"directory (WAL and SSTs, before compaction).\n")
print("| events | into | publish rate /s | RSS growth | disk growth | per topic, beyond the same events in one topic: RSS / disk |")
print("|---|---|---|---|---|---|")
runs = {os.path.basename(f)[:-5]: json.load(open(f)) for f in glob.glob(f"{out}/*.json")}
grow = lambda r, k: r[f"{k}_after"] - r[f"{k}_before"]
for name in sorted((k for k in runs if not k.startswith("one-")), key=lambda k: (k.startswith("lite"), runs[k]["n"])):
    r, one = runs[name], runs[f"one-{runs[name]['n']}"]
    n = r["n"]
    kind = "regular topics (one each)" if name.startswith("regular") else "lite topics session.<i> (one each)"
    for label, x in ((kind, r), ("one topic (the baseline)", one)):
        print(f"| {n:,} | {label} | {n / x['secs']:,.0f} | {grow(x, 'rss') / 2**20:.1f} MiB | {grow(x, 'disk') / 2**20:.1f} MiB |"
              + (f" {(grow(r, 'rss') - grow(one, 'rss')) / n:,.0f} B / {(grow(r, 'disk') - grow(one, 'disk')) / n:,.0f} B |" if x is r else " |"))
PY
{ echo; echo "Command: \`COUNTS=\"$COUNTS\" REGULAR=$REGULAR SHARDS=$SHARDS bash perf/lite_topics.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
