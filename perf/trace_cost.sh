#!/usr/bin/env bash
# What tracing costs per keep-alive publish, in instructions (callgrind: counts do not depend
# on what else the machine is doing). One keep-alive client publishes the same 1 KiB event N
# times per mode; the counters are zeroed after a warm-up and dumped after the N publishes, all
# of the server's threads counted (the exporter thread's encoding and sending too).
#
#   BEFORE=/path/to/evmesh/before/tracing bash perf/trace_cost.sh      (N=2000)
#
# Modes: the build before tracing existed (BEFORE, if given); this build with tracing off;
# off with a `traceparent` header on every publish (kept with the event: the frame is
# re-encoded); on, exporting to a local sink that answers 200, at trace_sample_ratio 0.01 and
# 1.0 (each event starts a trace: publish and store spans). Table appended to RESULTS.md, raw
# counts in perf/results/trace-cost-<stamp>/.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000}
PEERS=0 source perf/common.sh
OUT=$ROOT/perf/results/trace-cost-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
# The collector: takes every POST, answers 200 (what it costs is not the broker's).
python3 - > "$OUT/sink.log" 2>&1 <<'PY' &
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", 18399), H).serve_forever()
PY
SINK=$!; trap 'kill $SINK 2>/dev/null || true' EXIT
GIVEN_MODES=${MODES:-}
if [ -z "$GIVEN_MODES" ]; then MODES="off header ratio001 ratio1"; [ -n "${BEFORE:-}" ] && MODES="before $MODES"; fi
for mode in $MODES; do
  dir=$(mktemp -d /var/tmp/evmesh-tc-data.XXXX)
  bin=$EVMESH; flags=(); header=()
  case $mode in
    before) bin=$BEFORE ;;
    header) header=("traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00") ;;
    ratio001) flags=(--otlp-endpoint http://127.0.0.1:18399 --trace-sample-ratio 0.01) ;;
    ratio1) flags=(--otlp-endpoint http://127.0.0.1:18399 --trace-sample-ratio 1) ;;
  esac
  valgrind --tool=callgrind --callgrind-out-file="$OUT/$mode.%p.out" "$bin" serve --shards 1 --io-driver epoll \
    --data-dir "$dir" --listen 127.0.0.1:18380 --admin-listen 127.0.0.1:18381 "${flags[@]}" > "$OUT/$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:18381/readyz >/dev/null && break; sleep 0.5; done
  keepalive_publish 200 "${header[@]}"
  callgrind_control -z "$pid" > /dev/null
  keepalive_publish "$N" "${header[@]}"
  # What the exporter still holds is sent within a second: let it, inside the counted window.
  [ "${#flags[@]}" -gt 0 ] && sleep 2
  curl -s http://127.0.0.1:18381/metrics | grep '^evmesh_trace_spans' > "$OUT/$mode.spans" || true
  callgrind_control -d "$pid" > /dev/null
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
done
python3 - "$OUT" "$N" "$MODES" <<'PY' | tee "$OUT/summary.md"
import glob, os, re, sys
out, n, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def total(mode):
    counts = []
    for f in glob.glob(f"{out}/{mode}.*.out*"):
        m = re.search(r"^summary: (\d+)", open(f).read(), re.M) or re.search(r"^totals: (\d+)", open(f).read(), re.M)
        if m and not f.endswith(".out"):  # callgrind_control -d writes <file>.<n>
            counts.append(int(m.group(1)))
    return sum(counts)
def spans(mode):
    try:
        return " ".join(l.split()[0].replace("evmesh_trace_spans_", "") + "=" + l.split()[1] for l in open(f"{out}/{mode}.spans"))
    except OSError:
        return ""
base = total("off") / n
label = {"before": "before tracing (BEFORE)", "off": "tracing off", "header": "off, traceparent header kept",
         "ratio001": "on, ratio 0.01", "ratio1": "on, ratio 1.0"}
print(f"### tracing cost per publish in instructions, {os.path.basename(out)}\n")
print(f"callgrind, 1 shard, epoll, one keep-alive client, {n} publishes of a 1 KiB event after 200 of warm-up; "
      "all threads of the server counted (the exporter's too), timers included.\n")
print("| mode | instructions / publish | - tracing off | spans (exported, dropped, failed) |")
print("|---|---|---|---|")
for mode in modes:
    per = total(mode) / n
    print(f"| {label[mode]} | {per:,.0f} | {per - base:+,.0f} ({(per - base) / base:+.1%}) | {spans(mode)} |")
PY
rm -f "$OUT"/*.out; gzip -9 "$OUT"/*.out.*
{ echo; echo "Command: \`${BEFORE:+BEFORE=$BEFORE }${GIVEN_MODES:+MODES=\"$GIVEN_MODES\" }N=$N bash perf/trace_cost.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
