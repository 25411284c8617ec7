#!/usr/bin/env bash
# Hostile clients beside a victim: how much does each attack of the guide's "What a client cannot
# do to the broker" (docs/src/limits.md) cost a well-behaved publisher on the same shard?
#
#   bash perf/hostile.sh     (ROUNDS=3 DUR=6 RATE=2000 CONNS=8 DRIVERS="epoll uring" env knobs;
#                             ATTACKS="slowloris cesql ..." runs a subset)
#
# evmesh runs with one shard (victim and attacker share it), default limits, its own data dir, a
# fresh broker per phase. A phase: the attacker (perf/hostile_attack.py KIND) sets up and says
# `ready`, then the victim (loadgen, RATE 1 KiB structured events/s open loop over CONNS
# keep-alive connections, p50/p99/p99.9 coordinated-omission corrected) publishes for DUR
# seconds after 1 s of warm-up, then the attacker is stopped and /readyz, the broker's RSS and
# /metrics are read. The baseline phase is the victim alone. Rounds alternate all phases; the
# table gives medians over rounds. Raw reports in perf/results/hostile-<stamp>/, the table is
# appended to perf/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-6}; RATE=${RATE:-2000}; CONNS=${CONNS:-8}; DRIVERS=${DRIVERS:-epoll uring}
ATTACKS=${ATTACKS:-slowloris pipeline chunked attrs cesql ackflood connflood wsnoread pollclients}
PEERS=0 source perf/common.sh
OUT=$ROOT/perf/results/hostile-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
PORT=18580; ADMIN=http://127.0.0.1:18581
EV_PID=; ATT_PID=
cleanup() {
  [ -n "$ATT_PID" ] && kill "$ATT_PID" 2>/dev/null
  [ -n "$EV_PID" ] && kill "$EV_PID" 2>/dev/null
  true
}
trap cleanup EXIT

kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

phase() { # driver round attack
  local drv=$1 r=$2 attack=$3 name="r$2-$1-$3" dir ready_kb start_kb after_kb peak_kb readyz exited=null
  dir=$(mktemp -d /var/tmp/evmesh-hostile.XXXX)
  "$EVMESH" serve --shards 1 --io-driver "$drv" --data-dir "$dir" --listen "127.0.0.1:$PORT" \
    --admin-listen 127.0.0.1:18581 > "$OUT/$name.evmesh.log" 2>&1 &
  EV_PID=$!
  wait_ready "$ADMIN" || { cat "$OUT/$name.evmesh.log" >&2; exit 1; }
  start_kb=$(kb "$EV_PID" VmRSS)
  if [ "$attack" != baseline ]; then
    # Bounded by itself too: at most DUR + 60 s, setup included.
    python3 perf/hostile_attack.py "$attack" --port "$PORT" --duration $((DUR + 60)) > "$OUT/$name.attacker.txt" 2>&1 &
    ATT_PID=$!
    for _ in $(seq 600); do grep -q '^ready' "$OUT/$name.attacker.txt" && break; sleep 0.1; done
    grep -q '^ready' "$OUT/$name.attacker.txt" || { echo "$name: the attacker never got ready" >&2; cat "$OUT/$name.attacker.txt" >&2; }
  fi
  ready_kb=$(kb "$EV_PID" VmRSS)
  # /readyz late in the victim's window, while the attack runs (a stalled shard shows after 5 s).
  (sleep "$DUR"; curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$ADMIN/readyz" > "$OUT/$name.readyz-during" || true) &
  local probe=$!
  "$LOADGEN" --url "http://127.0.0.1:$PORT/events/publish?topic=victim" --connections "$CONNS" --rate "$RATE" \
    --duration "${DUR}s" --warmup 1s --server-pid "$EV_PID" --json "$OUT/$name.victim.json" | tee -a "$OUT/log.txt"
  if [ -n "$ATT_PID" ]; then kill -TERM "$ATT_PID" 2>/dev/null || true; wait "$ATT_PID" || true; ATT_PID=; fi
  wait "$probe" || true
  after_kb=$(kb "$EV_PID" VmRSS); peak_kb=$(kb "$EV_PID" VmHWM)
  readyz=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$ADMIN/readyz" || true)
  # The counters that moved (the rest of /metrics is zeros and help text); per-consumer lag
  # lines (thousands after pollclients) only counted.
  { curl -s --max-time 5 "$ADMIN/metrics" || true; } | awk '!/^#/ && $2 != 0 && !/^evmesh_consumer_lag/ {print}
    /^evmesh_consumer_lag/ && $2 != 0 {n++} END {print "# non-zero evmesh_consumer_lag lines: " n+0}' > "$OUT/$name.metrics.txt"
  if kill -0 "$EV_PID" 2>/dev/null; then kill "$EV_PID"; wait "$EV_PID" || true
  else wait "$EV_PID" && exited=0 || exited=$?; fi
  EV_PID=; rm -rf "$dir"
  python3 - "$OUT/$name" "$drv" "$r" "$attack" "$start_kb" "$ready_kb" "$after_kb" "$peak_kb" "$readyz" "$exited" <<'PY'
import json, os, sys
base, drv, r, attack, start, ready, after, peak, readyz, exited = sys.argv[1:]
att = None
if attack != "baseline":
    lines = [l for l in open(base + ".attacker.txt") if l.startswith("{")]
    att = json.loads(lines[-1]) if lines else None
during = open(base + ".readyz-during").read().strip() or "none"
os.remove(base + ".readyz-during")
json.dump({"driver": drv, "round": int(r), "attack": attack, "readyz_during": during, "readyz_after": readyz, "exited": json.loads(exited),
           "rss_kb": {"start": int(start or 0), "attacker_ready": int(ready or 0), "after": int(after or 0), "peak": int(peak or 0)},
           "attacker": att}, open(base + ".phase.json", "w"), indent=1)
PY
  echo "$name: rss ${start_kb} -> ${ready_kb} -> ${after_kb} kB (peak ${peak_kb}), readyz $readyz" | tee -a "$OUT/log.txt"
}

for r in $(seq "$ROUNDS"); do
  for drv in $DRIVERS; do
    for attack in baseline $ATTACKS; do phase "$drv" "$r" "$attack"; done
  done
done

python3 - "$OUT" "$ROUNDS" "$DUR" "$RATE" "$CONNS" "$DRIVERS" "$ATTACKS" <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, platform, statistics as st
out, rounds, dur, rate, conns, drivers, attacks = sys.argv[1:]
cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip()
print(f"### hostile clients beside a victim, {os.path.basename(out)}\n")
print(f"Machine: {cpu}, {os.cpu_count()} CPUs (shared), kernel {platform.release()}. evmesh --shards 1, default limits, "
      f"durability os, a fresh broker per phase. Victim: loadgen, {rate} x 1 KiB structured events/s open loop over {conns} "
      f"keep-alive connections to its own topic, {dur}s after 1s warm-up. Attackers: perf/hostile_attack.py (Python, "
      f"standard library). Medians over {rounds} rounds; the ratio is the median of each round's p99 over that round's "
      f"baseline p99; `answered` is the victim's answered requests per second over the {rate} it scheduled; "
      f"/readyz is read 1s before the victim's window ends (during) and after the attacker stopped (after), per round.\n")
ms = lambda us: "-" if us == float("inf") else f"{us / 1000:.2f}" if us < 10_000 else f"{us / 1000:.0f}"
for drv in drivers.split():
    phases = {}
    for f in sorted(glob.glob(f"{out}/r*-{drv}-*.phase.json")):
        p = json.load(open(f))
        p["victim"] = json.load(open(f.replace(".phase.json", ".victim.json")))
        phases.setdefault(p["attack"], {})[p["round"]] = p
    base = phases.get("baseline", {})
    print(f"#### io_driver = {drv}\n")
    print("| attack | victim p50 / p99 / p99.9 ms | baseline p99 ms | p99 / baseline | victim answered | victim errors "
          "| broker RSS start -> after MB (peak) | broker CPU (% core) | attacker CPU (% core) | /readyz during / after | what the attacker got (round 1) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for attack in ["baseline"] + attacks.split():
        runs = phases.get(attack, {})
        rs = sorted(runs)
        if not rs:
            continue
        v = [runs[r]["victim"] for r in rs]
        # A round in which the victim got no answer at all has no latencies: count it as infinite.
        us = lambda x, k: x["latency_us"][k] if x["ok"] else float("inf")
        lat = lambda k: st.median([us(x, k) for x in v])
        ratios = [us(runs[r]["victim"], "p99") / base[r]["victim"]["latency_us"]["p99"]
                  for r in rs if r in base and base[r]["victim"]["latency_us"]["p99"]]
        answered = st.median([x["throughput"] for x in v]) / float(rate)
        errors = sum(x["errors"] + x["connect_errors"] for x in v)
        rss = lambda k: st.median([runs[r]["rss_kb"][k] for r in rs]) / 1024
        bcpu = [x["server_cpu_util"] for x in v if x.get("server_cpu_util") is not None]
        acpu = [runs[r]["attacker"]["cpu_s"] / max(runs[r]["attacker"]["ran_s"], 0.1) for r in rs if runs[r]["attacker"]]
        readyz = ", ".join(f"{runs[r]['readyz_during']} / {runs[r]['readyz_after']}"
                           + ("" if runs[r]["exited"] is None else f" (exited {runs[r]['exited']})") for r in rs)
        got = runs[rs[0]]["attacker"]
        got = ", ".join(f"{k}: {n}" for k, n in got["counts"].items()) if got else ""
        starved = sum(x["ok"] == 0 for x in v)
        starved = f" (no answer at all in {starved} of {len(v)} rounds)" if starved else ""
        ratio = st.median(ratios) if ratios else float("nan")
        print(f"| {attack} | {ms(lat('p50'))} / {ms(lat('p99'))} / {ms(lat('p999'))}{starved} | "
              f"{ms(st.median([base[r]['victim']['latency_us']['p99'] for r in rs if r in base]))} | "
              f"{'none answered' if ratio == float('inf') else f'{ratio:.1f}x'} | {answered:.0%} | {errors} | {rss('start'):.0f} -> {rss('after'):.0f} ({rss('peak'):.0f}) | "
              f"{st.median(bcpu) * 100:.0f} | {(st.median(acpu) * 100 if acpu else 0):.0f} | {readyz} | {got} |")
    print()
PY
{ echo; echo "Command: \`ROUNDS=$ROUNDS DUR=$DUR RATE=$RATE CONNS=$CONNS DRIVERS=\"$DRIVERS\" bash perf/hostile.sh\` ($(date -u +%Y-%m-%d), raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
echo "raw results in $OUT"
