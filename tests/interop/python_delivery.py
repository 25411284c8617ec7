"""Interop: independent Python clients receive and acknowledge events: the `websockets` library
over WebSocket (subprotocol cloudevents.json, ack/nack, close codes), `httpx-sse` over
server-sent events, and plain `httpx` for long-poll and POST /events/ack. Delivered events are
parsed with the official CloudEvents SDK.

usage: python_delivery.py TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
"""
import json
import sys

import httpx
from httpx_sse import connect_sse
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from cloudevents.core.bindings.http import to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

traffic, admin = sys.argv[1], sys.argv[2]
base = f"http://{traffic}"
fmt = JSONFormat()
http = httpx.Client(base_url=base, timeout=20)


def subscribe(name, topic, **extra):
    r = http.post("/events/subscribe", json={"subscription": name, "topic": topic, "start": "earliest", **extra})
    assert r.status_code == 201, r.text


def publish(topic, ident):
    event = CloudEvent({"id": ident, "source": "/py", "type": "com.example.py", "specversion": "1.0"}, {"n": ident})
    msg = to_structured(event, fmt)
    r = http.post(f"/events/publish?topic={topic}", headers=dict(msg.headers), content=msg.body)
    assert r.status_code == 202, r.text


def check_delivered(raw, ident):
    event = fmt.read(None, raw if isinstance(raw, bytes) else raw.encode())
    attrs = event.get_attributes()
    assert event.get_id() == ident, attrs
    assert event.get_data() == {"n": ident}, event.get_data()
    for ext in ("emdeliveryid", "empartition", "emoffset", "emattempt"):
        assert ext in attrs, (ext, attrs)
    return attrs


# WebSocket: receive, ack, and nothing comes back after a reconnect.
subscribe("py-ws", "py-ws")
for i in range(3):
    publish("py-ws", f"w{i}")
ws_url = f"ws://{traffic}/events/ws?subscription=py-ws"
with connect(ws_url, subprotocols=["cloudevents.json"]) as ws:
    assert ws.subprotocol == "cloudevents.json", ws.subprotocol
    got = [check_delivered(ws.recv(timeout=20), f"w{i}") for i in range(3)]
    assert [a["emattempt"] for a in got] == [1, 1, 1], got
    # Nack the first: it comes back as attempt 2 (after the 50 ms backoff the test broker uses).
    ws.send(json.dumps({"type": "nack", "ids": [got[0]["emdeliveryid"]]}))
    again = check_delivered(ws.recv(timeout=20), "w0")
    assert again["emattempt"] == 2, again
    ws.send(json.dumps({"type": "ack", "ids": [a["emdeliveryid"] for a in got[1:]] + [again["emdeliveryid"]]}))
with connect(ws_url, subprotocols=["cloudevents.json"]) as ws:
    publish("py-ws", "w3")
    check_delivered(ws.recv(timeout=20), "w3")  # w0..w2 were acked: w3 is next
    ws.send("not a control message")
    try:
        ws.recv(timeout=20)
        raise AssertionError("the broker kept a session that sent garbage")
    except ConnectionClosed as e:
        assert e.rcvd is not None and e.rcvd.code == 1008, e

# Server-sent events, acked over HTTP.
subscribe("py-sse", "py-sse", ackTimeoutMs=60000)
for i in range(2):
    publish("py-sse", f"s{i}")
with httpx.Client(base_url=base, timeout=20) as sse_http:
    with connect_sse(sse_http, "GET", "/events/sse?subscription=py-sse") as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        seen = []
        for sse in source.iter_sse():
            attrs = check_delivered(sse.data, f"s{len(seen)}")
            assert sse.id == attrs["emdeliveryid"], (sse.id, attrs)
            seen.append(sse.id)
            if len(seen) == 2:
                break
r = http.post("/events/ack", json={"subscription": "py-sse", "ids": seen})
assert r.status_code == 200, r.text

# Long-poll: 204 when nothing comes in time, then a batch.
subscribe("py-poll", "py-poll")
r = http.get("/events/poll", params={"subscription": "py-poll", "waitMs": 100})
assert r.status_code == 204, r.status_code
publish("py-poll", "p0")
r = http.get("/events/poll", params={"subscription": "py-poll", "max": 10, "waitMs": 5000})
assert r.status_code == 200 and r.headers["content-type"] == "application/cloudevents-batch+json", r
batch = r.json()
attrs = check_delivered(json.dumps(batch[0]), "p0")
r = http.post("/events/ack", json={"subscription": "py-poll", "ids": [attrs["emdeliveryid"]]})
assert r.status_code == 200, r.text

print("all checks passed")
