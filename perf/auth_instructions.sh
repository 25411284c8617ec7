#!/usr/bin/env bash
# What authentication, the ACL and a rate limit cost per keep-alive publish, in instructions:
# the server runs under valgrind's callgrind (instruction counts do not depend on what else
# the machine is doing, unlike the CPU time perf/auth_cost.sh reads), and one keep-alive client
# publishes the same 1 KiB event N times per mode. The counters are zeroed after a warm-up and
# dumped after the N publishes, so the total is exactly theirs (plus the shard's timers).
#
#   bash perf/auth_instructions.sh        (N=2000)
#
# Modes: auth = none; auth = token with one ACL rule; the same plus a rate limit on the
# principal (high enough never to refuse). Table appended to RESULTS.md, raw counts in
# perf/results/auth-instructions-<stamp>/.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000}
PEERS=0 source perf/common.sh
OUT=$ROOT/perf/results/auth-instructions-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
KEYS=$(mktemp -d /var/tmp/evmesh-ai.XXXX); trap 'rm -rf "$KEYS"' EXIT
TOKEN=perf-static-token-0123456789
token_files "$KEYS" "$TOKEN"
for mode in none token limited; do
  dir=$(mktemp -d /var/tmp/evmesh-ai-data.XXXX)
  flags=(); tok=""
  [ "$mode" != none ] && { flags=(--auth token --auth-tokens-file "$KEYS/tokens.jsonl" --config "$KEYS/evmesh.toml" --admin-token admin-token-0123456789); tok=$TOKEN; }
  valgrind --tool=callgrind --callgrind-out-file="$OUT/$mode.%p.out" "$EVMESH" serve --shards 1 --io-driver epoll \
    --data-dir "$dir" --listen 127.0.0.1:18380 --admin-listen 127.0.0.1:18381 "${flags[@]}" > "$OUT/$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:18381/readyz >/dev/null && break; sleep 0.5; done
  if [ "$mode" = limited ]; then
    curl -sf -X PUT http://127.0.0.1:18381/admin/limits/perf -H 'authorization: Bearer admin-token-0123456789' \
      -d '{"scope": "principal:perf-svc", "eventsPerSecond": 1000000000}' > /dev/null
  fi
  keepalive_publish 200 ${tok:+"authorization=Bearer $tok"}
  callgrind_control -z "$pid" > /dev/null
  keepalive_publish "$N" ${tok:+"authorization=Bearer $tok"}
  callgrind_control -d "$pid" > /dev/null
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
done
python3 - "$OUT" "$N" <<'PY' | tee "$OUT/summary.md"
import glob, os, re, sys
out, n = sys.argv[1], int(sys.argv[2])
def total(mode):
    # The dump made after the N publishes (the last one written but the final exit dump).
    counts = []
    for f in glob.glob(f"{out}/{mode}.*.out*"):
        m = re.search(r"^summary: (\d+)", open(f).read(), re.M) or re.search(r"^totals: (\d+)", open(f).read(), re.M)
        if m:
            counts.append((os.path.getmtime(f), f, int(m.group(1))))
    dumps = [c for c in counts if not c[1].endswith(".out")]  # callgrind_control -d writes <file>.<n>
    return sum(c[2] for c in dumps)
base = total("none") / n
print(f"### auth cost per publish in instructions, {os.path.basename(out)}\n")
print(f"callgrind, 1 shard, epoll, one keep-alive client, {n} publishes of a 1 KiB event after 200 of warm-up; "
      f"all threads of the server counted, timers included.\n")
print("| mode | instructions / publish | - none |")
print("|---|---|---|")
for mode, label in [("none", "auth = none"), ("token", "auth = token + ACL"), ("limited", "token + ACL + rate limit")]:
    per = total(mode) / n
    print(f"| {label} | {per:,.0f} | {per - base:+,.0f} |")
PY
# Keep the counted windows (compressed), not the whole runs' exit dumps.
rm -f "$OUT"/*.out; gzip -9 "$OUT"/*.out.*
{ echo; echo "Command: \`${EVMESH_BIN:+EVMESH_BIN=$EVMESH_BIN }N=$N bash perf/auth_instructions.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
