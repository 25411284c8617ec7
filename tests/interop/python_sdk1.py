"""Interop: the official Python CloudEvents SDK 1.x (PyPI `cloudevents` 1.12, the generation most
installed) sending through `requests`, as its documentation shows. Its binary mode does not
percent-encode attribute values, and `requests` sends a str header as ISO-8859-1 bytes: evmesh
must accept `ce-subject: s 1 é%` (the `é` as the byte 0xE9) and store the attribute as the SDK had
it. Every event is read back through the admin API and parsed again with the SDK's own reader.
(A value holding `%` and two hex digits, `100%25`, cannot be told from an encoded one: the
binding says it is encoded, and evmesh decodes it; docs/src/publishing.md says so.)

usage: python_sdk1.py TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
The test command runs it with PYTHONPATH pointing at a directory holding SDK 1.x and requests.
"""
import base64
import json
import sys

import cloudevents
import requests
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent, from_json

assert cloudevents.__version__.startswith("1."), cloudevents.__version__
traffic, admin = sys.argv[1], sys.argv[2]
topic = "sdk-python-1"


def post(headers, body):
    r = requests.post(f"http://{traffic}/events/publish", params={"topic": topic}, headers=headers, data=body)
    assert r.status_code == 202, (r.status_code, r.text, headers)
    return r.json()


def stored(placed):
    r = requests.get(f"http://{admin}/admin/topics/{topic}/partitions/{placed['partition']}/events",
                     params={"from": placed["offset"], "max": 1})
    got = r.json()
    assert got and got[0]["offset"] == placed["offset"], got
    return got[0]["event"]


def check(mode, event, placed, sent=None):
    got = stored(placed)
    attrs = {k: v for k, v in event.get_attributes().items() if isinstance(v, str)}
    for k, v in attrs.items():
        assert got.get(k) == v, (mode, k, got.get(k), v)
    # The SDK reads what evmesh stored as the same event.
    back = from_json(json.dumps(got).encode())
    for k, v in attrs.items():
        assert back[k] == v, (mode, k, back[k], v)
    if sent is not None:
        # Binary mode: the data is the body the SDK sent, byte for byte (SDK 1.x JSON-encodes a
        # str even as text/plain).
        if "data_base64" in got:
            assert base64.b64decode(got["data_base64"]) == sent, (mode, got, sent)
        elif "data" in got:
            json_media = got.get("datacontenttype", "").endswith("json")
            assert got["data"] == (json.loads(sent) if json_media else sent.decode()), (mode, got, sent)
        else:
            assert not sent, (mode, got, sent)
        return print(f"ok {mode} {event['id']} -> {placed['partition']}/{placed['offset']}")
    raw = base64.b64decode(got["data_base64"]) if "data_base64" in got else got.get("data")
    assert raw == event.data, (mode, got, event.data)
    print(f"ok {mode} {event['id']} -> {placed['partition']}/{placed['offset']}")


events = [
    # What the issue reported: every such event was refused with 400 "truncated percent-encoding".
    CloudEvent({"type": "com.example.latin1", "source": "/sdk/py1", "subject": "s 1 é%"}, {"a": 1}),
    CloudEvent({"type": "com.example.pct", "source": "/sdk/py1", "subject": "100% sure, 5%-10%",
                "region": "eu-wést", "note": "%zz %4"}, b"opaque \x00\xff"),
    CloudEvent({"type": "com.example.text", "source": "/sdk/py1", "datacontenttype": "text/plain",
                "subject": "ÿ-ascii and ü"}, "plain text"),
    CloudEvent({"type": "com.example.nodata", "source": "/sdk/py1/ä"}),
]
for e in events:
    headers, body = to_binary(e)
    check("binary", e, post(headers, body), body or b"")
    headers, body = to_structured(e)
    check("structured", e, post(headers, body))
print("python sdk 1.x interop: all checks passed")
