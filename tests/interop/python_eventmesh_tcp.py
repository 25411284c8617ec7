"""A classic EventMesh TCP client in Python (eventmesh_tcp_client.py, written from the Java
codec) against evmesh's tcp_listen: HELLO, SUBSCRIBE, LISTEN, publish (EventMeshMessage and
CloudEvents), ack, request-reply and heartbeats. Argument 1: the traffic listener; the TCP
listener in EVMESH_TCP. Prints "all checks passed" or exits non-zero."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eventmesh_tcp_client import CE, MESH, Client, mesh_message  # noqa: E402

host, port = os.environ["EVMESH_TCP"].rsplit(":", 1)
addr = (host, int(port))


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


sub = Client(addr)
h, _ = sub.hello("py-group", "sub")
check(h["code"] == 0, "HELLO answered success: %r" % h)
topics = {"topicList": [{"topic": "py.orders", "mode": "CLUSTERING", "type": "ASYNC"},
                        {"topic": "py.rr", "mode": "CLUSTERING", "type": "SYNC"}]}
h, _ = sub.call("SUBSCRIBE_REQUEST", "SUBSCRIBE_RESPONSE", json.dumps(topics).encode())
check(h["code"] == 0, "SUBSCRIBE answered success: %r" % h)
h, _ = sub.call("LISTEN_REQUEST", "LISTEN_RESPONSE")
check(h["code"] == 0, "LISTEN answered success: %r" % h)

pub = Client(addr)
check(pub.hello("py-pub", "pub")[0]["code"] == 0, "publisher's HELLO")
for i in range(5):
    h, _ = pub.call("ASYNC_MESSAGE_TO_SERVER", "ASYNC_MESSAGE_TO_SERVER_ACK",
                    mesh_message("py.orders", "order-%d" % i, {"region": "eu"}), MESH)
    check(h["code"] == 0, "publish %d acked: %r" % (i, h))
event = {"specversion": "1.0", "id": "ce-1", "source": "/py", "type": "py.test", "subject": "py.orders",
         "datacontenttype": "application/json", "data": {"total": 12}}
h, _ = pub.call("ASYNC_MESSAGE_TO_SERVER", "ASYNC_MESSAGE_TO_SERVER_ACK", json.dumps(event).encode(), CE)
check(h["code"] == 0, "CloudEvent publish acked: %r" % h)

got = []
while len(got) < 6:
    h, body = sub.wait("ASYNC_MESSAGE_TO_CLIENT")
    got.append((h["properties"]["protocoltype"], json.loads(body)))
    sub.send("ASYNC_MESSAGE_TO_CLIENT_ACK", body, seq=h["seq"], properties=h["properties"])
bodies = [m["body"] for kind, m in got if kind == "eventmeshmessage"]
check(bodies == ["order-%d" % i for i in range(5)], "EventMeshMessages in order: %r" % bodies)
check(got[0][1]["properties"].get("region") == "eu", "properties kept: %r" % got[0][1])
ces = [m for kind, m in got if kind == "cloudevents"]
check(len(ces) == 1 and ces[0]["id"] == "ce-1" and ces[0]["data"] == {"total": 12}, "the CloudEvent: %r" % ces)

# Heartbeats, on both connections.
for c in (sub, pub):
    h, _ = c.call("HEARTBEAT_REQUEST", "HEARTBEAT_RESPONSE")
    check(h["code"] == 0, "heartbeat answered: %r" % h)

# Request-reply: the publisher asks, the SYNC subscriber answers with the message it got.
seq = pub.send("REQUEST_TO_SERVER", mesh_message("py.rr", "ping", {"ttl": "5000"}), properties=MESH)
h, body = sub.wait("REQUEST_TO_CLIENT")
sub.send("REQUEST_TO_CLIENT_ACK", body, seq=h["seq"], properties=h["properties"])
request = json.loads(body)
check(request["body"] == "ping", "the request: %r" % request)
request["body"] = "pong"
sub.send("RESPONSE_TO_SERVER", json.dumps(request).encode(), properties=MESH)
h, body = pub.wait("RESPONSE_TO_CLIENT", seq)
check(h["code"] == 0 and json.loads(body)["body"] == "pong", "the reply: %r %r" % (h, body))
pub.send("RESPONSE_TO_CLIENT_ACK", body, seq=seq, properties=h["properties"])

h, _ = pub.call("CLIENT_GOODBYE_REQUEST", "CLIENT_GOODBYE_RESPONSE")
check(h["code"] == 0, "goodbye answered")
check(pub.read() is None, "closed after the goodbye")
sub.close()
print("all checks passed")
