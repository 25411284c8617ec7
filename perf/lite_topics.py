"""Publishes one ~200-byte event to each of N topics named PREFIX<i> (or, with a fourth argument
`same`, N events to the one topic PREFIX), pipelined (1,000 requests per write) over one
keep-alive connection. usage: lite_topics.py HOST:PORT PREFIX N [same]"""
import socket
import sys

host, port = sys.argv[1].rsplit(":", 1)
prefix, n = sys.argv[2], int(sys.argv[3])
same = sys.argv[4:] == ["same"]
s = socket.create_connection((host, int(port)))
f = s.makefile("rb")
data = "x" * 60
for start in range(0, n, 1000):
    out = []
    for i in range(start, min(n, start + 1000)):
        body = ('{"specversion":"1.0","id":"e%d","source":"/perf/lite","type":"com.example.lite",'
                '"datacontenttype":"text/plain","data":"%s"}' % (i, data)).encode()
        out.append(b"POST /events/publish?topic=%s%s HTTP/1.1\r\nhost: x\r\ncontent-type: application/cloudevents+json\r\n"
                   b"content-length: %d\r\n\r\n%s" % (prefix.encode(), b"" if same else b"%d" % i, len(body), body))
    s.sendall(b"".join(out))
    for _ in out:
        status = f.readline().split()[1]
        length = 0
        while True:
            line = f.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.partition(b":")
            if k.lower() == b"content-length":
                length = int(v)
        f.read(length)
        if status != b"202":
            sys.exit(f"publish {prefix}: HTTP {status.decode()}")
