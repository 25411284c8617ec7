"""A classic EventMesh TCP client, written from apache/eventmesh's Java codec (commit 2527428,
eventmesh-common/.../protocol/tcp/codec/Codec.java, Header.java, Command.java, UserAgent.java):
magic "EventMesh", version "0000", a big-endian int32 length = 13 + header + body, a big-endian
int32 header length, the header's JSON, the body. Nothing here is evmesh's."""

import json
import random
import socket
import struct

MAGIC = b"EventMesh0000"


def encode(header, body=b""):
    h = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + struct.pack(">ii", 13 + len(h) + len(body), len(h)) + h + body


class Client:
    def __init__(self, addr, timeout=10):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.buf = b""
        self.pending = []  # packages read while waiting for another

    def send(self, cmd, body=b"", seq=None, properties=None):
        seq = seq if seq is not None else "".join(random.choice("012345678") for _ in range(10))
        header = {"cmd": cmd, "code": 0, "seq": seq, "properties": properties or {}}
        self.sock.sendall(encode(header, body))
        return seq

    def read(self):
        """The next package: (header, body); None once the server closed."""
        if self.pending:
            return self.pending.pop(0)
        while True:
            if len(self.buf) >= 21:
                if self.buf[:13] != MAGIC:
                    raise ValueError("bad magic %r" % self.buf[:13])
                length, hlen = struct.unpack(">ii", self.buf[13:21])
                total = length + 8
                if len(self.buf) >= total:
                    header = json.loads(self.buf[21:21 + hlen])
                    body = self.buf[21 + hlen:total]
                    self.buf = self.buf[total:]
                    return header, body
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk

    def wait(self, cmd, seq=None):
        """Reads until a package of `cmd` (and `seq`) arrives; keeps the others for read()."""
        kept = []
        while True:
            p = self.pending.pop(0) if self.pending else None
            if p is None:
                self.pending, saved = [], self.pending
                p = self.read()
                self.pending = saved
            if p is None:
                raise EOFError("closed while waiting for %s" % cmd)
            h, _ = p
            if h["cmd"] == cmd and (seq is None or h.get("seq") == seq):
                self.pending = kept + self.pending
                return p
            kept.append(p)

    def call(self, cmd, answer, body=b"", properties=None):
        seq = self.send(cmd, body, properties=properties)
        return self.wait(answer, seq)

    def hello(self, group, purpose, token=None):
        ua = {"env": "test", "subsystem": "5023", "path": "/", "pid": 32, "host": "127.0.0.1",
              "port": 0, "version": "2.0", "username": "u", "password": token or "",
              "idc": "FT", "group": group, "purpose": purpose, "unack": 0}
        return self.call("HELLO_REQUEST", "HELLO_RESPONSE", json.dumps(ua).encode())

    def close(self):
        self.sock.close()


def mesh_message(topic, body, props=None):
    return json.dumps({"topic": topic, "body": body, "properties": props or {}}).encode()


MESH = {"protocoltype": "eventmeshmessage", "protocolversion": "1.0", "protocoldesc": "tcp"}
CE = {"protocoltype": "cloudevents", "protocolversion": "1.0", "protocoldesc": "tcp"}
