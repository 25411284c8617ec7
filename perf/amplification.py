"""Read amplification over Kafka, measured (driven by perf/amplification.sh; the venv's Python).

Three evmesh instances over one Kafka broker (traffic and admin URLs in argv). TOPICS topics,
each with one LOAD_BALANCE subscription and one consumer that asks recommend and attaches at
its home over WebSocket, acking each event. EVENTS events of about 1 KiB are published to each
topic, round robin over the instances. Once every consumer has all of its events, each
instance's `evmesh_kafka_tail_bytes_total` (bytes of events its Kafka tail read) is compared
with the bytes stored by all instances (`evmesh_bytes_stored_total` summed): 1.0 means the
instance read everything written, 1/3 its share of three. Beside it, a measure any build has:
the bytes that crossed the loopback interface during the run (/proc/net/dev: Kafka produce and
fetch, but also the publishes, deliveries and acks, the same in every build), over the same.

Prints one JSON line: per instance its topics homed (sessions) and tail bytes / bytes written.
"""

import asyncio
import json
import os
import sys

import httpx
import websockets

urls, admins, pids = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3].split(",")
TOPICS, EVENTS = int(os.environ.get("TOPICS", "30")), int(os.environ.get("EVENTS", "200"))


def loopback():
    line = next(l for l in open("/proc/net/dev") if l.strip().startswith("lo:"))
    return int(line.split(":", 1)[1].split()[0])  # bytes received (= sent) on lo


def metric(text, name):
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))


async def main():
    http = httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=64))
    lo_start = loopback()
    for t in range(TOPICS):
        r = await http.post(f"{urls[t % 3]}/events/subscribe",
                            json={"subscription": f"s{t}", "topic": f"t{t}", "mode": "LOAD_BALANCE", "start": "earliest"})
        assert r.status_code in (200, 201), r.text
    got, homes = [0] * TOPICS, {}

    async def consume(t):
        while True:
            r = await http.get(f"{urls[t % 3]}/session/recommend?subscription=s{t}")
            if r.status_code == 200:
                break
            await asyncio.sleep(0.1)
        home = r.json()["instanceUrl"]
        homes[t] = home
        while True:
            try:
                ws = await websockets.connect(home.replace("http://", "ws://") + f"/events/ws?subscription=s{t}")
                break
            except websockets.InvalidStatus:
                # 404 while the definition is on its way to the home, 503 while it settles.
                await asyncio.sleep(0.1)
        async with ws:
            while got[t] < EVENTS:
                e = json.loads(await ws.recv())
                got[t] += 1
                await ws.send(json.dumps({"type": "ack", "ids": [e["emdeliveryid"]]}))

    consumers = [asyncio.create_task(consume(t)) for t in range(TOPICS)]
    room = asyncio.Semaphore(64)

    async def publish(t, i):
        event = {"specversion": "1.0", "id": f"t{t}-{i}", "source": "/perf", "type": "perf.amp", "data": "x" * 900}
        async with room:
            r = await http.post(f"{urls[(t + i) % 3]}/events/publish?topic=t{t}", content=json.dumps(event),
                                headers={"content-type": "application/cloudevents+json"})
            assert r.status_code == 202, r.text

    await asyncio.gather(*(publish(t, i) for i in range(EVENTS) for t in range(TOPICS)))
    await asyncio.wait_for(asyncio.gather(*consumers), 120)
    lo = loopback() - lo_start
    texts = [(await http.get(f"{a}/metrics")).text for a in admins]
    written = sum(metric(x, "evmesh_bytes_stored_total") for x in texts)
    out = {"topics": TOPICS, "events_per_topic": EVENTS, "bytes_written": written,
           "loopback_per_written": round(lo / max(written, 1), 2), "instances": []}
    for u, x, pid in zip(urls, texts, pids):
        read = metric(x, "evmesh_kafka_tail_bytes_total")
        out["instances"].append({"url": u, "pid": pid, "topics_homed": sum(1 for h in homes.values() if h == u),
                                 "tail_bytes": read, "read_per_written": round(read / max(written, 1), 3)})
    print(json.dumps(out))
    await http.aclose()


asyncio.run(main())
