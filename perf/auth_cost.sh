#!/usr/bin/env bash
# What authentication and the ACL cost per keep-alive publish: the same evmesh build with
# auth = none, auth = token (static token) and auth = jwt (an RS256 token minted by PyJWT), each
# with one ACL rule allowing the publish, in alternation, under the same load:
#
#   bash perf/auth_cost.sh        (ROUNDS=3 DUR=10 CONNS=64 DRIVER=epoll)
#
# Closed loop (max rate), 1 shard, both load generators the spec names: loadgen, then
# `wrk -t1 -c64` posting the same 1 KiB event with the same Authorization header. Server CPU from
# /proc/PID/stat. The table gives each mode's median CPU µs per publish and its difference to
# auth = none in the same rounds. Raw reports in perf/results/auth-cost-<stamp>/; the table is
# appended to RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-10}; CONNS=${CONNS:-64}; DRIVER=${DRIVER:-epoll}
PEERS=0 source perf/common.sh
VENV=${VENV:-/var/tmp/evmesh-venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -c 'import jwt, cryptography' 2>/dev/null || "$VENV/bin/pip" install -q pyjwt==2.10.1 cryptography==46.0.3
OUT=$ROOT/perf/results/auth-cost-$(date -u +%Y%m%dT%H%M%SZ); mkdir -p "$OUT"
KEYS=$(mktemp -d /var/tmp/evmesh-auth.XXXX); trap 'rm -rf "$KEYS"' EXIT
TOKEN=perf-static-token-0123456789
token_files "$KEYS" "$TOKEN"
JWT=$("$VENV/bin/python" - "$KEYS" <<'PY'
import json, sys, time
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key())); jwk.update({"kid": "perf", "alg": "RS256"})
json.dump({"keys": [jwk]}, open(f"{sys.argv[1]}/jwks.json", "w"))
print(jwt.encode({"sub": "perf-jwt", "exp": int(time.time()) + 86400}, key, algorithm="RS256", headers={"kid": "perf"}))
PY
)
for r in $(seq "$ROUNDS"); do
  for mode in none token jwt; do
    dir=$(mktemp -d /var/tmp/evmesh-auth-data.XXXX)
    case $mode in
      none) flags=(); tok="" ;;
      token) flags=(--auth token --auth-tokens-file "$KEYS/tokens.jsonl" --config "$KEYS/evmesh.toml"); tok=$TOKEN ;;
      jwt) flags=(--auth jwt --jwt-jwks-file "$KEYS/jwks.json" --config "$KEYS/evmesh.toml"); tok=$JWT ;;
    esac
    "$EVMESH" serve --shards 1 --io-driver "$DRIVER" --data-dir "$dir" --listen 127.0.0.1:18180 \
      --admin-listen 127.0.0.1:18181 "${flags[@]}" > "$OUT/evmesh.log" 2>&1 &
    pid=$!
    wait_ready http://127.0.0.1:18181 || { cat "$OUT/evmesh.log" >&2; exit 1; }
    hdr=(); [ -n "$tok" ] && hdr=(--header "Authorization: Bearer $tok")
    "$LOADGEN" --url "http://127.0.0.1:18180/events/publish?topic=perf" --connections "$CONNS" --duration "${DUR}s" \
      --warmup 1s --server-pid "$pid" "${hdr[@]}" --json "$OUT/r$r-$mode.json" | tee -a "$OUT/log.txt"
    post_lua "$OUT/.post.lua" "$tok"
    wrk_run "r$r-$mode" "http://127.0.0.1:18180/events/publish?topic=perf" "$pid" "$OUT/.post.lua"
    kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
  done
done
rm -f "$OUT/.post.lua"

python3 - "$OUT" "$ROUNDS" "$DUR" "$CONNS" "$DRIVER" <<'PY' | tee "$OUT/summary.md"
import json, sys, glob, os, statistics as st
out, rounds, dur, conns, driver = sys.argv[1:]
def runs(name, kind):
    return [json.load(open(f)) for f in sorted(glob.glob(f"{out}/r*-{name}.{kind}"))]
def med(name, kind, key):
    return st.median(r[key] for r in runs(name, kind))
print(f"### auth cost per publish, {os.path.basename(out)}\n")
print(f"1 shard, {driver}, durability os, {conns} keep-alive connections, closed loop, {dur}s per run after 1s "
      f"warm-up, {rounds} rounds with the modes in alternation; one ACL rule allows the publish. CPU is the "
      f"server's, from /proc. Errors must be 0 (every publish 202).\n")
for kind, label in [("json", "loadgen"), ("wrk.json", "wrk -t1")]:
    print(f"| {label}: auth | throughput (req/s, median) | server CPU µs/publish (median) | per round | - none | errors |")
    print("|---|---|---|---|---|---|")
    base = med("none", kind, "server_cpu_us_per_op")
    for mode in ["none", "token", "jwt"]:
        cpu = med(mode, kind, "server_cpu_us_per_op")
        per = ", ".join(f"{r['server_cpu_us_per_op']:.2f}" for r in runs(mode, kind))
        errs = sum(r.get("errors", 0) for r in runs(mode, kind))
        print(f"| {mode} | {med(mode, kind, 'throughput'):.0f} | {cpu:.2f} | {per} | {cpu - base:+.2f} | {errs} |")
    print()
PY
{ echo; echo "Command: \`ROUNDS=$ROUNDS DUR=$DUR CONNS=$CONNS DRIVER=$DRIVER bash perf/auth_cost.sh\` (raw: perf/results/$(basename "$OUT")/)"; echo; cat "$OUT/summary.md"; } >> perf/RESULTS.md
