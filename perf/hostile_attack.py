#!/usr/bin/env python3
"""One hostile client against an evmesh traffic listener on loopback, for perf/hostile.sh.

    python3 perf/hostile_attack.py KIND --port 18580 [--duration 60]

KIND is one of: slowloris, pipeline, chunked, attrs, cesql, ackflood, connflood, wsnoread, pollclients
(see ATTACKS below; each is one category of docs/src/limits.md, "What a client cannot do to the broker").
Each attack first sets up what it needs (subscriptions, backlogs, sessions), prints `ready` on
stdout, then attacks until SIGTERM or --duration, whichever comes first; it is bounded in
connections and requests as well as in time. On the way out it prints one JSON line of counts
(answers by status, connections, bytes) and exits 0.

Standard library only; it refuses any host but 127.0.0.1.
"""

import argparse
import json
import os
import resource
import selectors
import signal
import socket
import sys
import threading
import time
from collections import Counter

HOST = "127.0.0.1"
STOP = threading.Event()
LOCK = threading.Lock()
COUNTS = Counter()


def count(key, n=1):
    with LOCK:
        COUNTS[key] += n


def connect(port, rcvbuf=None, timeout=5.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: small window
    s.settimeout(timeout)
    s.connect((HOST, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    count("connections")
    return s


def request(method, path, body=b"", ctype=None, extra=""):
    head = f"{method} {path} HTTP/1.1\r\nhost: {HOST}\r\n"
    if ctype:
        head += f"content-type: {ctype}\r\n"
    if body or method == "POST":
        head += f"content-length: {len(body)}\r\n"
    return (head + extra + "\r\n").encode() + body


class Reader:
    """Reads HTTP/1.1 responses (Content-Length framed) from a blocking socket."""

    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def _more(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        self.buf += chunk

    def response(self):
        while b"\r\n\r\n" not in self.buf:
            self._more()
        end = self.buf.index(b"\r\n\r\n") + 4
        head = self.buf[:end].decode("latin-1")
        status = int(head.split(" ", 2)[1])
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while len(self.buf) < end + length:
            self._more()
        body = self.buf[end:end + length]
        self.buf = self.buf[end + length:]
        return status, body


def exchange(port, reqs, timeout=30.0):
    """Sends each request on one keep-alive connection, in turn; returns the statuses."""
    s = connect(port, timeout=timeout)
    r, out = Reader(s), []
    for q in reqs:
        s.sendall(q)
        out.append(r.response()[0])
    s.close()
    return out


def setup(port, method, path, body):
    status = exchange(port, [request(method, path, json.dumps(body).encode(), "application/json")])[0]
    if status >= 300:
        sys.exit(f"setup {method} {path}: {status}")


def event(eid, data="x", **ext):
    e = {"specversion": "1.0", "id": eid, "source": "/attacker", "type": "com.example.hostile"}
    e.update(ext)
    e["data"] = data
    return json.dumps(e).encode()


def publish_backlog(port, topic, n, size):
    s = connect(port, timeout=30)
    r = Reader(s)
    for i in range(n):
        s.sendall(request("POST", f"/events/publish?topic={topic}", event(f"big{i}", "x" * size),
                          "application/cloudevents+json"))
        if r.response()[0] != 202:
            sys.exit(f"backlog publish to {topic} refused")
    s.close()


def keep_alive_loop(port, reqs, name, max_requests):
    """Sends `reqs` round-robin on a keep-alive connection (reconnecting whenever the broker
    closes it), counting answers by status."""
    sent = 0
    while not STOP.is_set() and sent < max_requests:
        try:
            s = connect(port, timeout=30)
            r = Reader(s)
            while not STOP.is_set() and sent < max_requests:
                q = reqs[sent % len(reqs)]
                sent += 1
                s.sendall(q)
                count(f"{name} {r.response()[0]}")
        except OSError as e:
            count(f"{name} {type(e).__name__}")
        finally:
            try:
                s.close()
            except Exception:
                pass


def run_threads(targets):
    ts = [threading.Thread(target=f, args=a, daemon=True) for f, a in targets]
    for t in ts:
        t.start()
    return ts


# 1. Slowloris: many connections, each trickling a publish head one byte at a time.
def slowloris(a):
    head = (b"POST /events/publish?topic=slow HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"content-type: application/cloudevents+json\r\nx-pad: " + b"p" * 200 + b"\r\n")
    sel = selectors.DefaultSelector()
    conns = {}  # socket -> bytes sent of the head

    def open_one():
        try:
            s = connect(a.port, timeout=2)
        except OSError as e:
            count(f"connect {type(e).__name__}")
            return
        s.setblocking(False)
        conns[s] = 0
        sel.register(s, selectors.EVENT_READ)

    def drop(s):
        sel.unregister(s)
        del conns[s]
        s.close()

    for _ in range(a.conns):
        open_one()
    print("ready", flush=True)
    # Each connection sends a byte every a.interval seconds, spread evenly over the interval.
    tick = 0.01
    per_tick = max(1, int(a.conns * tick / a.interval))
    while not STOP.is_set():
        for key, _ in sel.select(0):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1.1 "):
                count(f"answer {data[9:12].decode()}")
            count("closed by broker")
            drop(s)
            if count_total() < a.max_connections:
                open_one()
        for _ in range(min(per_tick, len(conns))):
            s = next(iter(conns))  # the least recently fed: dicts keep insertion order
            pos = conns.pop(s)
            try:
                s.send(head[pos % len(head):pos % len(head) + 1])
                conns[s] = pos + 1
                count("bytes sent")
            except OSError:
                count("send error")
                sel.unregister(s)
                s.close()
        time.sleep(tick)
    count("open at end", len(conns))


def count_total():
    with LOCK:
        return COUNTS["connections"]


# 1b. Pipelining: one keep-alive connection that always has its next requests in flight
#     (GET of an unknown path, 404), answers read on another thread.
def pipeline(a):
    s = connect(a.port, timeout=10)
    batch = request("GET", "/nowhere") * 1000

    def reader():
        while not STOP.is_set():
            try:
                data = s.recv(1 << 20)
            except OSError:
                break
            if not data:
                count("closed by broker")
                break
            count("answers", data.count(b"HTTP/1.1 "))
    run_threads([(reader, ())])
    print("ready", flush=True)
    sent = 0
    try:
        while not STOP.is_set() and sent < a.max_requests:
            s.sendall(batch)
            sent += 1000
    except OSError as e:
        count(f"send {type(e).__name__}")
    count("requests sent", sent)


# 2. Chunked framing: 1-byte chunks with 1000-byte extensions, 1-byte chunks without, and an
#    endless run of trailer lines after the last chunk. Each connection streams until the
#    broker answers (413/431) or stops reading; then a new connection starts over.
CHUNKED_HEAD = (b"POST /events/publish?topic=chunky HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                b"content-type: application/cloudevents+json\r\ntransfer-encoding: chunked\r\n\r\n")


def stream_until_refused(port, name, prefix, piece, per_conn_cap):
    batch = piece * (65536 // len(piece) + 1)
    while not STOP.is_set() and count_total() < 100_000:
        try:
            s = connect(port, timeout=10)
        except OSError as e:
            count(f"{name} connect {type(e).__name__}")
            time.sleep(0.01)
            continue
        sent = 0
        try:
            s.sendall(prefix)
            while not STOP.is_set() and sent < per_conn_cap:
                s.sendall(batch)
                sent += len(batch)
        except OSError:
            pass
        count(f"{name} bytes", sent)
        try:
            s.settimeout(2)
            count(f"{name} {Reader(s).response()[0]}")
        except (OSError, ValueError, IndexError) as e:
            count(f"{name} {type(e).__name__}")
        s.close()


def chunked(a):
    print("ready", flush=True)
    cap = 50 << 20
    ext = b"1;" + b"e" * 999 + b"\r\nx\r\n"
    ts = run_threads([(stream_until_refused, (a.port, "extensions", CHUNKED_HEAD, ext, cap))] * 2
                     + [(stream_until_refused, (a.port, "tiny chunks", CHUNKED_HEAD, b"1\r\nx\r\n", cap))]
                     + [(stream_until_refused,
                         (a.port, "trailers", CHUNKED_HEAD + b"1\r\nx\r\n0\r\n", b"x-trailer: some value\r\n", cap))])
    for t in ts:
        t.join()


# 3. Oversized and many-attribute structured events: 2,000 extension attributes (over the
#    1,024 cap: 400), 1,000 (under it: accepted and stored), a 2 MiB body (413).
def attrs(a):
    def with_attrs(n):
        e = {"specversion": "1.0", "id": f"attrs{n}", "source": "/attacker", "type": "com.example.hostile"}
        e.update({f"a{i:x}": i for i in range(n)})
        return request("POST", "/events/publish?topic=attrs", json.dumps(e).encode(), "application/cloudevents+json")
    over = event("huge", "x" * (2 << 20))
    print("ready", flush=True)
    ts = run_threads([
        (keep_alive_loop, (a.port, [with_attrs(2000)], "2000 attributes", a.max_requests)),
        (keep_alive_loop, (a.port, [with_attrs(1000)], "1000 attributes", a.max_requests)),
        (keep_alive_loop, (a.port, [request("POST", "/events/publish?topic=attrs", over,
                                            "application/cloudevents+json")], "2 MiB body", a.max_requests)),
    ])
    for t in ts:
        t.join()


# 4. Hostile CESQL: subscriptions whose filters are worst cases (a long literal LIKE, a LIKE
#    with many `_`, nested concat over a large attribute), each with an attached WebSocket
#    session, then large events to their topic.
WS_KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def ws_attach(port, query, rcvbuf=None):
    s = connect(port, rcvbuf=rcvbuf, timeout=10)
    s.sendall(f"GET /events/ws?{query} HTTP/1.1\r\nhost: {HOST}\r\nupgrade: websocket\r\nconnection: upgrade\r\n"
              f"sec-websocket-version: 13\r\nsec-websocket-key: {WS_KEY}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        b = s.recv(1)
        if not b:
            raise ConnectionError("closed during the handshake")
        head += b
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(head.split(b"\r\n")[0].decode())
    count("sessions attached")
    return s


def ws_text(payload):
    """A masked (client) text frame; the mask is all zeros, which RFC 6455 allows."""
    data = payload.encode()
    n = len(data)
    if n < 126:
        hdr = bytes([0x81, 0x80 | n])
    elif n < 65536:
        hdr = bytes([0x81, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        hdr = bytes([0x81, 0x80 | 127]) + n.to_bytes(8, "big")
    return hdr + b"\0\0\0\0" + data


def drain(s, name):
    s.settimeout(0.5)
    while not STOP.is_set():
        try:
            data = s.recv(1 << 16)
        except socket.timeout:
            continue
        except OSError:
            break
        if not data:
            count(f"{name} closed by broker")
            break
        count(f"{name} bytes received", len(data))


def cesql(a):
    literal = "x LIKE '%" + "a" * 3000 + "b'"
    wild = "x LIKE '%" + "a_" * 1000 + "b%'"
    inner = "concat(" + ",".join(["x"] * 60) + ")"
    nested = "length(concat(" + ",".join([inner] * 16) + ")) > 0"
    sessions = []
    for name, sql, mode in [("lit", literal, "LOAD_BALANCE"), ("wild", wild, "LOAD_BALANCE"),
                            ("cat", nested, "LOAD_BALANCE"), ("catlive", nested, "BROADCAST")]:
        setup(a.port, "POST", "/events/subscribe",
              {"subscription": name, "topic": "cq", "mode": mode, "filters": [{"sql": sql}]})
        q = f"subscription={name}" + ("&ack=none" if mode == "BROADCAST" else "")
        sessions.append((drain, (ws_attach(a.port, q), name)))
    run_threads(sessions)
    big = request("POST", "/events/publish?topic=cq", event("h", "d", x="a" * 300_000),
                  "application/cloudevents+json")
    print("ready", flush=True)
    ts = run_threads([(keep_alive_loop, (a.port, [big], "300 KB event", a.max_requests))] * 2)
    for t in ts:
        t.join()


# 5. Ack flood: POST /events/ack with 10,000 ids naming a partition the topic lacks (400),
#    10,000 descending ids of its one partition (settled, 200), and 10,001 ids (400).
def ackflood(a):
    setup(a.port, "POST", "/events/subscribe", {"subscription": "ak", "topic": "ak"})

    def ack(ids):
        return request("POST", "/events/ack", json.dumps({"subscription": "ak", "ids": ids}).encode(),
                       "application/json")
    reqs = [ack([f"7:{i}:1" for i in range(10_000)]),
            ack([f"0:{i}:1" for i in range(10_000, 0, -1)]),
            ack([f"0:{i}:1" for i in range(10_001)])]
    print("ready", flush=True)
    ts = run_threads([(keep_alive_loop, (a.port, reqs, "ack 10k ids", a.max_requests))] * 2)
    for t in ts:
        t.join()


# 6. Connection flood: open a.conns idle connections as fast as possible, hold them, and churn
#    a.churn of them a second (close the oldest, open a new one).
def connflood(a):
    conns = []
    for _ in range(a.conns):
        try:
            conns.append(connect(a.port, timeout=2))
        except OSError as e:
            count(f"connect {type(e).__name__}")
    print("ready", flush=True)
    while not STOP.is_set():
        t0 = time.monotonic()
        for _ in range(a.churn // 10):
            if conns:
                conns.pop(0).close()
            try:
                conns.append(connect(a.port, timeout=2))
            except OSError as e:
                count(f"connect {type(e).__name__}")
        time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))
    alive = 0
    for s in conns:  # how many the broker still holds open: no EOF, no error
        s.setblocking(False)
        try:
            s.recv(1)
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    count("held open at end", alive)


# 7. WebSocket sessions that raise their credit to 4096 and never read, over a backlog of
#    300 events of 100 KB; one new session (a new clientId) replaces the oldest every 0.5 s.
def wsnoread(a):
    setup(a.port, "POST", "/events/subscribe",
          {"subscription": "nr", "topic": "nr", "mode": "BROADCAST", "start": "earliest"})
    publish_backlog(a.port, "nr", 300, 100_000)
    sessions, n = [], 0

    def open_one():
        nonlocal n
        s = ws_attach(a.port, f"subscription=nr&clientId=r{n}", rcvbuf=4096)
        n += 1
        s.sendall(ws_text(json.dumps({"type": "credit", "n": 4096})))
        sessions.append(s)
    for _ in range(a.conns):
        open_one()
    print("ready", flush=True)
    while not STOP.is_set() and n < a.max_requests:
        STOP.wait(0.5)
        sessions.pop(0).close()
        try:
            open_one()
        except OSError as e:
            count(f"attach {type(e).__name__}")
    count("sessions open at end", len(sessions))


# 8. A new clientId for every long-poll of a BROADCAST subscription with a backlog of 60 events
#    of 200 KB: each poll is a new consumer that starts from the beginning.
def pollclients(a):
    setup(a.port, "POST", "/events/subscribe",
          {"subscription": "bb", "topic": "big", "mode": "BROADCAST", "start": "earliest"})
    publish_backlog(a.port, "big", 60, 200_000)
    ids = iter(range(a.max_requests))
    print("ready", flush=True)

    def poller():
        while not STOP.is_set():
            with LOCK:
                i = next(ids, None)
            if i is None:
                return
            try:
                s = connect(a.port, timeout=30)
                s.sendall(request("GET", f"/events/poll?subscription=bb&clientId=p{i}&max=1000&waitMs=2000"))
                status, body = Reader(s).response()
                count(f"poll {status}")
                count("poll bytes received", len(body))
                s.close()
            except OSError as e:
                count(f"poll {type(e).__name__}")
    ts = run_threads([(poller, ())] * 4)
    for t in ts:
        t.join()


ATTACKS = {
    "slowloris": (slowloris, "2,000 connections trickling a publish head, one byte per connection a second"),
    "pipeline": (pipeline, "one connection pipelining GET /nowhere (404) back to back, answers read meanwhile"),
    "chunked": (chunked, "1-byte chunks with 1000-byte extensions, 1-byte chunks, endless trailers"),
    "attrs": (attrs, "events with 2,000 and 1,000 extension attributes, 2 MiB bodies"),
    "cesql": (cesql, "LIKE/concat worst-case filters with sessions, 300 KB events to their topic"),
    "ackflood": (ackflood, "POST /events/ack with 10,000 ids: unknown partition, descending, 10,001"),
    "connflood": (connflood, "9,000 idle connections held, 200 a second churned"),
    "wsnoread": (wsnoread, "credit-4096 WebSocket sessions that never read, 300 x 100 KB backlog"),
    "pollclients": (pollclients, "a new clientId per long-poll of a BROADCAST backlog of 60 x 200 KB"),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=sorted(ATTACKS))
    p.add_argument("--host", default=HOST)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--duration", type=float, default=60.0, help="seconds at most, setup included")
    p.add_argument("--conns", type=int, help="connections / sessions (slowloris, connflood, wsnoread)")
    p.add_argument("--interval", type=float, default=1.0, help="slowloris: seconds between a connection's bytes")
    p.add_argument("--churn", type=int, default=200, help="connflood: connections replaced per second")
    p.add_argument("--max-requests", type=int, help="requests (or new clients) per thread at most")
    p.add_argument("--max-connections", type=int, default=20_000, help="connections opened in all at most")
    a = p.parse_args()
    if a.host != HOST:
        sys.exit("the attacker only targets 127.0.0.1")
    a.conns = a.conns or {"slowloris": 2000, "connflood": 9000, "wsnoread": 20}.get(a.kind, 0)
    if a.max_requests is None:  # bounds that the duration, not the count, reaches first
        a.max_requests = {"pollclients": 10_000, "wsnoread": 1000, "pipeline": 50_000_000}.get(a.kind, 100_000)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    signal.signal(signal.SIGINT, lambda *_: STOP.set())
    # The attack thread is a daemon: the deadline or a signal ends the process even if a
    # socket call is stuck; counts are reported either way.
    started = time.monotonic()
    t = threading.Thread(target=ATTACKS[a.kind][0], args=(a,), daemon=True)
    t.start()
    while t.is_alive() and not STOP.is_set() and time.monotonic() - started < a.duration:
        t.join(0.1)
    STOP.set()
    t.join(5)
    cpu = os.times()
    with LOCK:
        report = {"attack": a.kind, "what": ATTACKS[a.kind][1], "counts": dict(COUNTS),
                  "cpu_s": round(cpu.user + cpu.system, 2), "ran_s": round(time.monotonic() - started, 1)}
    print(json.dumps(report), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
