"""Interop: CloudEvents published over WebSocket by the Python `websockets` library (subprotocol
cloudevents.json), with events built by the official CloudEvents SDK: a pipelined publishing
session (`GET /events/ws?publish=T`) answered in order, and a `{"type":"publish"}` message on an
acknowledged delivery session, answered among its deliveries. Every stored event is read back
through the admin API.

usage: python_ws_publish.py TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
"""
import json
import sys
import urllib.request

from websockets.sync.client import connect

from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

traffic, admin = sys.argv[1], sys.argv[2]
fmt = JSONFormat()


def event(ident):
    e = CloudEvent({"id": ident, "source": "/py/ws", "type": "com.example.ws", "specversion": "1.0", "region": "eu-wést"}, {"n": ident})
    return fmt.write(e).decode()


def stored(topic):
    out = []
    for p in range(8):
        url = f"http://{admin}/admin/topics/{topic}/partitions/{p}/events?from=0&max=1000"
        try:
            with urllib.request.urlopen(url) as r:
                out += [e["event"] for e in json.loads(r.read())]
        except urllib.error.HTTPError:
            break
    return out


# A publishing session: 50 events sent without waiting, one of them invalid; answered in order.
with connect(f"ws://{traffic}/events/ws?publish=wspy", subprotocols=["cloudevents.json"]) as ws:
    assert ws.subprotocol == "cloudevents.json", ws.subprotocol
    for i in range(50):
        ws.send(event(f"p{i}") if i != 13 else json.dumps({"specversion": "1.0", "id": "p13"}))
    answers = [json.loads(ws.recv(timeout=10)) for _ in range(50)]
for i, a in enumerate(answers):
    assert a["id"] == f"p{i}", (i, a)
    if i == 13:
        assert (a["type"], a["status"]) == ("error", 400), a
    else:
        assert a["type"] == "published" and isinstance(a["offset"], str), a
got = {e["id"]: e for e in stored("wspy")}
assert sorted(got) == sorted(f"p{i}" for i in range(50) if i != 13), sorted(got)
assert got["p7"]["region"] == "eu-wést" and got["p7"]["data"] == {"n": "p7"}, got["p7"]
print("ok publishing session: 49 published in order, 1 refused")

# A publish message on an acknowledged delivery session of the same topic.
req = urllib.request.Request(f"http://{traffic}/events/subscribe", method="POST",
                             data=json.dumps({"subscription": "wspy-sub", "topic": "wspy-loop"}).encode())
with urllib.request.urlopen(req) as r:
    assert r.status == 201, r.status
with connect(f"ws://{traffic}/events/ws?subscription=wspy-sub", subprotocols=["cloudevents.json"]) as ws:
    ws.send(json.dumps({"type": "publish", "topic": "wspy-loop", "event": json.loads(event("loop-1"))}))
    answer, delivered = None, None
    while answer is None or delivered is None:
        m = json.loads(ws.recv(timeout=10))
        if m.get("specversion") == "1.0":
            delivered = m
        else:
            answer = m
    assert (answer["type"], answer["id"]) == ("published", "loop-1"), answer
    assert delivered["id"] == "loop-1" and delivered["region"] == "eu-wést", delivered
    ws.send(json.dumps({"type": "ack", "ids": [delivered["emdeliveryid"]]}))
print("ok publish message on a delivery session: answered and delivered")
print("python websockets publish interop: all checks passed")
