"""Interop: request-reply with independent Python clients. Requesters are `httpx` (the request
built by the official CloudEvents SDK in structured and binary mode, the reply parsed by it);
responders are `websockets` sessions answering with a reply frame, or `httpx` posting the reply
to the request's own `emreplyto`. Also: the 504, a late reply's 404, a requester that hangs up.

usage: python_request_reply.py TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
"""
import json
import sys
import threading
import time
from datetime import datetime, timezone

import httpx
from websockets.sync.client import connect

from cloudevents.core.bindings.http import HTTPMessage, from_binary, to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

traffic, admin = sys.argv[1], sys.argv[2]
base = f"http://{traffic}"
fmt = JSONFormat()
http = httpx.Client(base_url=base, timeout=20)

r = http.post("/events/subscribe", json={"subscription": "py-rpc", "topic": "py-rpc", "start": "earliest"})
assert r.status_code == 201, r.text


def ask(ident, binary=False, timeout_ms=10000, accept=None):
    """Sends a request on a thread of its own; returns (thread, result holder)."""
    event = CloudEvent({"id": ident, "source": "/py/requester", "type": "com.example.ask", "specversion": "1.0",
                        "datacontenttype": "application/json"},
                       {"question": ident})
    msg = (to_binary if binary else to_structured)(event, fmt)
    headers = dict(msg.headers)
    if accept:
        headers["accept"] = accept
    out = {}

    def run():
        with httpx.Client(base_url=base, timeout=30) as c:
            out["response"] = c.post(f"/events/request?topic=py-rpc&timeoutMs={timeout_ms}", headers=headers,
                                     content=msg.body)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def reply_to(request, answer):
    return {"specversion": "1.0", "id": f"re-{request['id']}", "source": "/py/responder", "type": "com.example.answer",
            "emcorrelationid": request["emcorrelationid"], "datacontenttype": "application/json", "data": answer}


with connect(f"ws://{traffic}/events/ws?subscription=py-rpc", subprotocols=["cloudevents.json"]) as ws:
    # Structured request, answered on the WebSocket.
    t, out = ask("q1")
    request = json.loads(ws.recv(timeout=20))
    event = fmt.read(None, json.dumps(request).encode())
    attrs = event.get_attributes()
    assert attrs["emreplyto"] == f"{base}/events/reply", attrs
    expiry = datetime.fromisoformat(attrs["emexpiry"].replace("Z", "+00:00"))
    left = (expiry - datetime.now(timezone.utc)).total_seconds()
    assert 5 < left <= 10.5, left
    assert event.get_data() == {"question": "q1"}, event.get_data()
    ws.send(json.dumps({"type": "reply", "event": reply_to(request, {"answer": 1})}))
    ws.send(json.dumps({"type": "ack", "ids": [request["emdeliveryid"]]}))
    t.join()
    resp = out["response"]
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/cloudevents+json", resp.headers
    reply = fmt.read(None, resp.content)
    assert reply.get_id() == "re-q1" and reply.get_data() == {"answer": 1}, reply.get_attributes()

    # Binary request, answered by POST to its emreplyto, reply asked for in binary mode.
    t, out = ask("q2", binary=True, accept="application/json")
    request = json.loads(ws.recv(timeout=20))
    assert request["data"] == {"question": "q2"}, request
    r = httpx.post(request["emreplyto"], json=reply_to(request, {"answer": 2}),
                   headers={"content-type": "application/cloudevents+json"})
    assert r.status_code == 202, r.text
    ws.send(json.dumps({"type": "ack", "ids": [request["emdeliveryid"]]}))
    t.join()
    resp = out["response"]
    assert resp.status_code == 200, resp.text
    reply = from_binary(HTTPMessage(dict(resp.headers), resp.content), fmt, CloudEvent)
    assert reply.get_id() == "re-q2" and reply.get_data() == {"answer": 2}, reply.get_attributes()

    # Nobody answers in time: 504 problem+json; the reply after it: 404.
    t, out = ask("q3", timeout_ms=300)
    request = json.loads(ws.recv(timeout=20))
    t.join()
    assert out["response"].status_code == 504, out["response"].text
    assert out["response"].headers["content-type"] == "application/problem+json"
    r = http.post("/events/reply", json=reply_to(request, {"late": True}),
                  headers={"content-type": "application/cloudevents+json"})
    assert r.status_code == 404, r.text
    ws.send(json.dumps({"type": "reply", "event": reply_to(request, {"late": True})}))
    note = json.loads(ws.recv(timeout=20))
    assert note["type"] == "error" and note["status"] == 404 and note["id"] == request["emcorrelationid"], note

    # A requester that hangs up: its reply is 404 at once.
    event = CloudEvent({"id": "q4", "source": "/py", "type": "t", "specversion": "1.0"}, None)
    msg = to_structured(event, fmt)
    c = httpx.Client(base_url=base, timeout=0.3)
    try:
        c.post("/events/request?topic=py-rpc&timeoutMs=30000", headers=dict(msg.headers), content=msg.body)
        raise AssertionError("a reply nobody sent")
    except httpx.ReadTimeout:
        c.close()
    request = json.loads(ws.recv(timeout=20))
    assert request["id"] == "q4", request
    # The broker notices the hang-up by itself (no reply needed to find out) ...
    deadline = time.time() + 5
    while True:
        metrics = httpx.get(f"http://{admin}/metrics").text
        pending = sum(float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines() if l.startswith("evmesh_requests_pending{"))
        if pending == 0:
            break
        assert time.time() < deadline, "the hung-up requester still waits"
        time.sleep(0.05)
    # ... and its reply then matches nothing.
    r = http.post("/events/reply", json=reply_to(request, {}), headers={"content-type": "application/cloudevents+json"})
    assert r.status_code == 404, r.text

print("all checks passed")
