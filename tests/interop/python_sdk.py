"""Interop: events built by the official Python CloudEvents SDK (PyPI `cloudevents`) in structured,
binary and batched mode are accepted by evmesh and read back faithfully through the admin API.

usage: python_sdk.py TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
"""
import base64
import json
import sys
import urllib.parse
import urllib.request

from cloudevents.core.bindings.http import to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

traffic, admin = sys.argv[1], sys.argv[2]
fmt = JSONFormat()
topic = "sdk-python"


def post(headers, body):
    req = urllib.request.Request(f"http://{traffic}/events/publish?topic={topic}", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req) as r:
        assert r.status == 202, r.status
        return json.loads(r.read())


def stored(partition, offset):
    url = f"http://{admin}/admin/topics/{topic}/partitions/{partition}/events?from={offset}&max=1"
    with urllib.request.urlopen(url) as r:
        got = json.loads(r.read())
    assert got and got[0]["offset"] == offset, got
    return got[0]["event"]


def wire_data(event):
    d = event.get_data()
    if isinstance(d, (dict, list)):
        return ("json", d)
    if isinstance(d, str):
        return ("bytes", d.encode())
    return ("bytes", bytes(d) if d is not None else None)


def check(mode, event, placed, sent_headers=None):
    got = stored(placed["partition"], placed["offset"])
    for k, v in event.get_attributes().items():
        if sent_headers is not None:
            # Binary mode: every attribute is the header string the SDK sent, percent-decoded.
            # A string attribute is itself again, whatever the SDK's encoding of it.
            if k == "datacontenttype":
                want = sent_headers["content-type"]
            elif isinstance(v, str):
                want = v
            else:
                want = urllib.parse.unquote(sent_headers[f"ce-{k}"])
        elif k == "time":
            want = json.loads(fmt.write(event))["time"]
        else:
            want = v
        assert got.get(k) == want, (mode, k, got.get(k), want)
    kind, want = wire_data(event)
    if kind == "json":
        assert got["data"] == want, (mode, got, want)
    elif want is None:
        assert "data" not in got and "data_base64" not in got, (mode, got)
    elif "data_base64" in got:
        assert base64.b64decode(got["data_base64"]) == want, (mode, got)
    else:
        assert got["data"].encode() == want, (mode, got, want)
    print(f"ok {mode} {event.get_id()} -> {placed['partition']}/{placed['offset']}")


events = [
    CloudEvent({"type": "com.example.json", "source": "/sdk/py", "datacontenttype": "application/json", "amount": 120, "vip": True, "region": "eu-wést"}, {"sku": "A-1", "qty": [1, 2], "note": "ünïcode"}),
    CloudEvent({"type": "com.example.text", "source": "/sdk/py", "datacontenttype": "text/plain", "subject": "s 1 é% \"q\" 50%"}, "plain text, with \"quotes\""),
    CloudEvent({"type": "com.example.bytes", "source": "/sdk/py", "datacontenttype": "application/octet-stream", "partitionkey": "k-1"}, bytes(range(256))),
    CloudEvent({"type": "com.example.nodata", "source": "/sdk/py"}),
]

for e in events:
    m = to_structured(e, fmt)
    check("structured", e, post(dict(m.headers), m.body))
for e in events:
    m = to_binary(e, fmt)
    headers = {k.lower(): v for k, v in m.headers.items()}
    check("binary", e, post(headers, m.body), headers)
batch = b"[" + b",".join(fmt.write(e) for e in events) + b"]"
results = post({"content-type": "application/cloudevents-batch+json"}, batch)["results"]
assert len(results) == len(events)
for e, placed in zip(events, results):
    check("batch", e, placed)
print("python sdk interop: all checks passed")
