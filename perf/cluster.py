"""One takeover under load, measured (driven by perf/cluster.sh; run with the venv's Python).

Three evmesh instances over one Kafka broker (already started, their traffic URLs in argv).
A LOAD_BALANCE subscription; a publisher posts RATE events/s round robin over the instances
(as a plain L4 balancer would: a refused connection goes to the next one); one consumer asks
`GET /session/recommend`, attaches at the home over WebSocket and acks each event as it reads
it. After WARM seconds the home is killed (kill -9, its pid in argv); the consumer reconnects
through recommend at the survivors. The run ends when every event the broker acknowledged
(202) has been read, or after DRAIN seconds.

Prints one JSON line:
  takeover_s      kill -> first event delivered by the new home
  published       events answered 202 (published_per_s: over the WARM + AFTER seconds)
  lost            answered 202 and never delivered (must be 0)
  duplicates      deliveries of an id already delivered
  redelivered_from_old_home
                  ids delivered before the kill and again after it: what the old home had in
                  flight (read, ack not yet applied, or applied in its last 10 ms of offsets
                  not yet in Kafka). duplicates == this means nothing else came twice.
  unknown         publishes that got no answer (the killed instance died with them)
  delivered       distinct ids delivered
"""

import asyncio
import json
import os
import signal
import sys
import time

import httpx
import websockets

urls, pids = sys.argv[1].split(","), [int(p) for p in sys.argv[2].split(",")]
admins = sys.argv[3].split(",") if len(sys.argv) > 3 else []
RATE, WARM, AFTER, DRAIN = (float(os.environ.get(k, d)) for k, d in
                            [("RATE", "500"), ("WARM", "5"), ("AFTER", "5"), ("DRAIN", "30")])
SUB = os.environ.get("SUB", "takeover")


async def main():
    http = httpx.AsyncClient(timeout=5, limits=httpx.Limits(max_connections=96))
    r = await http.post(f"{urls[0]}/events/subscribe",
                        json={"subscription": SUB, "topic": SUB, "mode": "LOAD_BALANCE", "start": "earliest"})
    assert r.status_code in (200, 201), r.text
    published, unknown, seen, by_old = {}, set(), {}, set()
    state = {"killed_at": None, "first_after": None, "home": None, "in_flight": 0, "stop": False}
    dead = set()

    async def one(i, room):
        eid = f"e{i}"
        event = {"specversion": "1.0", "id": eid, "source": "/perf", "type": "perf.takeover", "data": "x" * 200}
        async with room:
            for k in range(len(urls)):
                u = urls[(i + k) % len(urls)]
                if u in dead:
                    continue
                try:
                    r = await http.post(f"{u}/events/publish?topic={SUB}", content=json.dumps(event),
                                        headers={"content-type": "application/cloudevents+json"})
                except httpx.ConnectError:
                    continue  # refused: the balancer tries the next instance
                except httpx.HTTPError:
                    unknown.add(eid)  # sent, no answer: stored or not
                    return
                if r.status_code == 202:
                    published[eid] = (u, r.json())
                else:
                    unknown.add(eid)
                return

    async def publish():
        # Open loop: one publish started every 1/RATE s, at most 64 in flight.
        i, start, room, running = 0, time.monotonic(), asyncio.Semaphore(64), set()
        while not state["stop"]:
            await asyncio.sleep(max(0.0, start + i / RATE - time.monotonic()))
            t = asyncio.create_task(one(i, room))
            running.add(t)
            t.add_done_callback(running.discard)
            i += 1
        await asyncio.gather(*running)

    async def recommend():
        while True:
            for u in urls:
                if u in dead:
                    continue
                try:
                    r = await http.get(f"{u}/session/recommend?subscription={SUB}")
                    if r.status_code == 200:
                        home = r.json()["instanceUrl"]
                        if home not in dead:
                            return home
                except httpx.HTTPError:
                    pass
            await asyncio.sleep(0.05)

    async def consume():
        while not state["stop"]:
            home = await recommend()
            state["home"] = home
            try:
                async with websockets.connect(home.replace("http://", "ws://") + f"/events/ws?subscription={SUB}",
                                              max_size=None) as ws:
                    async for msg in ws:
                        e = json.loads(msg)
                        seen[e["id"]] = seen.get(e["id"], 0) + 1
                        if home in dead:
                            by_old.add(e["id"])
                        if state["killed_at"] and state["first_after"] is None and home not in dead:
                            state["first_after"] = time.monotonic() - state["killed_at"]
                        await ws.send(json.dumps({"type": "ack", "ids": [e["emdeliveryid"]]}))
            except (OSError, websockets.WebSocketException):
                await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(publish()), asyncio.create_task(consume())]
    await asyncio.sleep(WARM)
    home = state["home"]
    victim = urls.index(home)
    before = set(seen)
    dead.add(home)
    os.kill(pids[victim], signal.SIGKILL)
    state["killed_at"] = time.monotonic()
    await asyncio.sleep(AFTER)
    state["stop"] = True
    await tasks[0]
    deadline = time.monotonic() + DRAIN
    while time.monotonic() < deadline and not published.keys() <= seen.keys():
        await asyncio.sleep(0.1)
    tasks[1].cancel()
    duplicates = sum(n - 1 for n in seen.values())
    # Delivered by the old home (before the kill, or read from its socket after) and again.
    again = sum(1 for i in before | by_old if seen[i] > 1)
    lost = sorted(published.keys() - seen.keys())
    # Where a lost event should be: what each surviving instance's copy holds at its offset,
    # and whether another publish was answered with the same offset.
    at = {}
    for (u, r) in published.values():
        at.setdefault((r["partition"], r["offset"]), []).append(u)
    collisions = sum(len(v) - 1 for v in at.values())
    stored = {}
    for i in lost:
        p, o = published[i][1]["partition"], published[i][1]["offset"]
        for a, u in zip(admins, urls):
            if u in dead:
                continue
            try:
                r = await http.get(f"{a}/admin/topics/{SUB}/partitions/{p}/events?from={o - 1}&max=3")
                stored.setdefault(i, []).append([[e["offset"], e["event"]["id"]] for e in r.json()])
            except httpx.HTTPError as e:
                stored.setdefault(i, []).append(str(e))
    print(json.dumps({
        "rate": RATE, "published_per_s": round(len(published) / (WARM + AFTER)), "takeover_s": state["first_after"], "published": len(published),
        "lost": len(lost), "lost_ids": [[i, *published[i]] for i in lost], "stored_there": stored,
        "offset_collisions": collisions, "duplicates": duplicates, "redelivered_from_old_home": again,
        "unknown": len(unknown), "delivered": len(seen),
    }))
    await http.aclose()


asyncio.run(main())
