"""A webhook sink written with Python's standard library (http.server), for the webhook tests.

Usage: python_sink.py PLAN_JSON

PLAN_JSON: {"secret": "k" | null, "answers": {"<ce-id>": ["500", "429:1", "200", ...]},
            "default": "200", "delay_ms": 0, "hold_ids": ["<ce-id>", ...],
            "tls": {"cert": "server.pem", "key": "server.key"} | null}
Each request for an event gets the next answer of its list ("STATUS", "STATUS:RETRY_AFTER",
either followed by "|BODY"), then `default`; the body is {"retCode":0} unless given. An event is
known by its `ce-id` header, or (a classic push's form) its `bizseqno` field. A request for an event in `hold_ids` is answered only after 60 s (a sink that
hangs). Prints {"port": N} first, then one JSON line per request received, as it arrives:
what the tests assert on (the headers, whether the signature verifies, how many requests were
in flight when it arrived).
"""

import hashlib
import hmac
import json
import ssl
import urllib.parse
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PLAN = json.loads(sys.argv[1])
SECRET = PLAN.get("secret")
ANSWERS = {k: list(v) for k, v in PLAN.get("answers", {}).items()}
DEFAULT = PLAN.get("default", "200")
DELAY = PLAN.get("delay_ms", 0) / 1000.0
HOLD = set(PLAN.get("hold_ids", []))
LOCK = threading.Lock()
INFLIGHT = [0]


def emit(record):
    with LOCK:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        with LOCK:
            INFLIGHT[0] += 1
            inflight = INFLIGHT[0]
        try:
            self.handle_post(inflight)
        finally:
            with LOCK:
                INFLIGHT[0] -= 1

    def handle_post(self, inflight):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        h = {k.lower(): v for k, v in self.headers.items()}
        names = [k.lower() for k in self.headers.keys()]
        repeated = sorted({n for n in names if names.count(n) > 1})
        sig_ok = None
        if SECRET is not None:
            base = "\n".join(
                ["POST", self.path, h.get("x-em-timestamp", ""), hashlib.sha256(body).hexdigest()]
            ).encode()
            want = "sha256=" + hmac.new(SECRET.encode(), base, hashlib.sha256).hexdigest()
            sig_ok = hmac.compare_digest(want, h.get("x-em-signature", ""))
        form = {}
        if h.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(), keep_blank_values=True).items()}
        ce_id = h.get("ce-id") or form.get("bizseqno", "")
        with LOCK:
            queue = ANSWERS.get(ce_id)
            answer = queue.pop(0) if queue else DEFAULT
        emit({
            "t": time.monotonic(),
            "path": self.path,
            "headers": h,
            "repeated": repeated,
            "body": body.decode("utf-8", "replace"),
            "form": form,
            "sig_ok": sig_ok,
            "inflight": inflight,
            "answer": answer,
        })
        if ce_id in HOLD:
            time.sleep(60)
        elif DELAY:
            time.sleep(DELAY)
        head, _, reply = answer.partition("|")
        status, _, retry = head.partition(":")
        self.send_response(int(status))
        if retry:
            self.send_header("Retry-After", retry)
        reply = (reply or '{"retCode":0}').encode()
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    server.daemon_threads = True
    tls = PLAN.get("tls")
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls["cert"], tls["key"])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    emit({"port": server.server_address[1]})
    server.serve_forever()


if __name__ == "__main__":
    main()
