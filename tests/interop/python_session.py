"""Interop: session pub/sub (Mode 2) with independent Python clients. Events are built by the
official CloudEvents SDK and published with `httpx`; the subscriber is `httpx-sse` (EventSource
semantics: `id:` lines, a reconnect with `Last-Event-ID`) and then `websockets`.

usage: python_session.py TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
"""
import json
import sys
import time

import httpx
from httpx_sse import connect_sse
from websockets.sync.client import connect

from cloudevents.core.bindings.http import to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

traffic = sys.argv[1]
base = f"http://{traffic}"
fmt = JSONFormat()
http = httpx.Client(base_url=base, timeout=20)


def publish(sid, ident, binary=False):
    event = CloudEvent({"id": ident, "source": "/py", "type": "chat.message", "specversion": "1.0",
                        "datacontenttype": "application/json"}, {"text": ident})
    msg = (to_binary if binary else to_structured)(event, fmt)
    r = http.post(f"/session/publish/{sid}", headers=dict(msg.headers), content=msg.body)
    assert r.status_code == 201, r.text
    return r.json()["offset"]


assert [publish("py-s1", f"m{i}", binary=i % 2 == 1) for i in range(3)] == [0, 1, 2]

# SSE: the session from its head, then live; a second subscriber meanwhile is 409.
with httpx.Client(base_url=base, timeout=20) as sub:
    with connect_sse(sub, "GET", "/session/subscribe/py-s1") as source:
        assert source.response.status_code == 200
        events = source.iter_sse()
        for i in range(3):
            sse = next(events)
            assert sse.id == str(i), sse.id
            data = json.loads(sse.data)
            assert data["id"] == f"m{i}" and data["data"] == {"text": f"m{i}"} and data["emoffset"] == str(i), data
        r = http.get("/session/subscribe/py-s1")
        assert r.status_code == 409 and r.headers["content-type"] == "application/problem+json", r.text
        assert publish("py-s1", "m3") == 3
        sse = next(events)
        assert sse.id == "3" and json.loads(sse.data)["id"] == "m3", sse

# The EventSource reconnect: Last-Event-ID resumes after the last id seen (retried until the
# broker has noticed the first stream went away).
for _ in range(100):
    sub = httpx.Client(base_url=base, timeout=20)
    with connect_sse(sub, "GET", "/session/subscribe/py-s1", headers={"last-event-id": "1"}) as source:
        if source.response.status_code == 409:
            sub.close()
            time.sleep(0.05)  # until the broker has seen the first stream go
            continue
        events = source.iter_sse()
        assert [next(events).id for _ in range(2)] == ["2", "3"]
        break
else:
    raise AssertionError("the first subscriber was never let go")
sub.close()

# WebSocket: the same session, all of it, then live.
for _ in range(100):
    try:
        ws = connect(f"ws://{traffic}/session/subscribe/py-s1")
        break
    except Exception:
        time.sleep(0.05)  # the SSE subscriber is let go once the broker sees it close
else:
    raise AssertionError("the SSE subscriber was never let go")
with ws:
    got = [json.loads(ws.recv(timeout=20))["id"] for _ in range(4)]
    assert got == ["m0", "m1", "m2", "m3"], got
    publish("py-s1", "m4")
    assert json.loads(ws.recv(timeout=20))["id"] == "m4"

print("all checks passed")
