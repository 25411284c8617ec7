"""Interop: the OpenAPI 3.1 document (openapi/evmesh.yaml) against the running broker, checked by a
validator nobody here wrote (openapi-core, pinned in scripts/test.sh).

Drives every path and method of the document with real requests over raw HTTP/1.1 (a good answer
and the refusals each can give: 400, 404, 409, 405, 413, 415, 429, 431, 503, 504...), and
validates each request and each answer against the document with openapi-core's
V31RequestValidator / V31ResponseValidator (raw request/response protocol objects). Requests the
broker must refuse are also checked against the document: where the document can say the input is
wrong (a pattern, a bound, a required field), it must reject the request too. WebSocket upgrades
are checked by hand (openapi-core cannot validate a 101): the status and the documented headers.
A method a path does not document is answered 405 with `Allow` naming exactly the documented
methods (traffic listener) or 404 (admin listener), as problems.

Fails when a (path, method) of the document was never driven (unless listed in NOT_DRIVEN with
the reason), when one was driven without a good answer or without a refusal (unless listed in
NO_REFUSAL), and on every mismatch. Where the broker contradicts SPEC.md the document keeps
SPEC's shape: those answers are listed in SPEC_CONTRADICTIONS and must still fail validation (an
entry that stops failing is a failure too: take it out of the list).

usage: openapi_check.py run REPO_ROOT TRAFFIC ADMIN     (exit 0 = every check passed)
"""
import base64
import json
import os
import socket
import sys
import threading
import time
from urllib.parse import parse_qsl, urlsplit

import yaml
from jsonschema_path import SchemaPath
from openapi_core import V31RequestValidator, V31ResponseValidator
from openapi_core.datatypes import RequestParameters
from openapi_core.deserializing.media_types.util import json_loads, plain_loads
from openapi_core.templating.paths.exceptions import PathError
from openapi_core.validation.schemas import oas31_schema_validators_factory
from openapi_spec_validator import validate as validate_spec
from werkzeug.datastructures import Headers, ImmutableMultiDict

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")

# Documented servers: each listener's requests are validated as if sent to the URL the document
# gives it, so a path documented on the wrong listener does not match.
DOC_SERVER = {"traffic": "http://127.0.0.1:8080", "admin": "http://127.0.0.1:8081"}

# How a server-sent event stream is read: until its first whole event (at most 5 s).
SSE = {"stream_for": 5, "until": b"\n\n"}

# Media types openapi-core does not parse by itself.
EXTRA_DESERIALIZERS = {
    "application/problem+json": json_loads,
    "application/cloudevents+json": json_loads,
    "application/cloudevents-batch+json": json_loads,
    "application/yaml": plain_loads,
    "text/event-stream": plain_loads,
}

# Server-sent events: the JSON of each `data:` line is checked against this schema of the document
# (OpenAPI 3.1 has no schema for an event stream's items; the descriptions say what they are).
SSE_DATA = {
    ("/events/sse", "get"): "Delivery",
    ("/session/subscribe/{sid}", "get"): "CloudEvent",
}

# (path, method) of the document that are not driven here, with the reason. Every path of the
# traffic and admin listeners can be driven against one broker with auth = none: remote A2A
# servers and webhook sinks are other systems, but the paths they use (`/agent/register` with
# `a2aUrl`, `/a2a/...`, `/events/subscribe` with `sink`) are driven with a local agent and a sink
# nobody listens on.
NOT_DRIVEN = {}

# (path, method) driven whose refusals the document cannot show as a 4xx, with the reason.
NO_REFUSAL = {
    ("/healthz", "get"): "a probe: nothing a client sends changes its answer",
    ("/readyz", "get"): "a probe: 503 only while starting or broken (not drivable on a running broker)",
    ("/metrics", "get"): "a scrape: nothing a client sends changes its answer",
    ("/openapi.yaml", "get"): "a static document",
    ("/admin/topics", "get"): "a listing; 401/403 need auth, which this broker (auth = none) does not ask",
    ("/admin/subscriptions", "get"): "a listing; 401/403 need auth",
    ("/admin/cluster", "get"): "a listing; 401/403 need auth",
    ("/admin/agents", "get"): "a listing; 401/403 need auth",
    ("/admin/acl", "get"): "a listing; 401/403 need auth",
    ("/admin/limits", "get"): "a listing; 401/403 need auth",
    ("/admin/quotas", "get"): "a listing; 401/403 need auth",
    ("/admin/transformers", "get"): "a listing; 401/403 need auth",
    ("/admin/routes", "get"): "a listing; 401/403 need auth",
    ("/console", "get"): "the page; 401/403 need auth, which this broker (auth = none) does not ask",
}

# Operations with no good answer on this broker (they are SPEC contradictions, see below).
NO_SUCCESS = {}

# Answers where the broker contradicts SPEC.md: the document keeps SPEC's shape, so validation
# must fail for them; (path template, method, status) -> what SPEC.md says and what the broker does.
SPEC_CONTRADICTIONS = {
    ("/", "post", 400): 'SPEC.md "Other protocols": classic "answers are HTTP 200 with {"retCode","retMsg","resTime"}" '
    "(and every error a client can cause is problem+json); the broker answers an unknown `code` HTTP 400 "
    "with the classic envelope (retCode 2)",
}
# Answers to methods a path does not document that contradict SPEC.md ("Every error a client can
# cause is an HTTP status with an application/problem+json body"): path template -> what happens.
METHOD_CONTRADICTIONS = {
    "/": "405 with the classic envelope, not a problem",
    "/eventmesh/publish": "405 with the classic envelope, not a problem",
    "/eventmesh/publish/batch": "405 with the classic envelope, not a problem",
    "/eventmesh/subscribe/local": "405 with the classic envelope, not a problem",
    "/eventmesh/unsubscribe/local": "405 with the classic envelope, not a problem",
    "/a2a/{agentId}/.well-known/agent-card.json": "405 with an empty body, not a problem",
    "/a2a/{agentId}": "405 with an empty body, not a problem",
}


class RawRequest:
    """openapi-core's request protocol."""

    def __init__(self, listener, method, target, headers, body):
        url = urlsplit(target)
        self.host_url = DOC_SERVER[listener]
        self.path = url.path
        self.method = method.lower()
        self.body = body or None
        ct = next((v for k, v in headers if k.lower() == "content-type"), "")
        self.content_type = ct.lower() if ct else ("" if not body else "application/octet-stream")
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(parse_qsl(url.query, keep_blank_values=True)),
            header=Headers(list(headers)),
            cookie=ImmutableMultiDict(),
            path={},
        )


class RawResponse:
    """openapi-core's response protocol, and what was read."""

    def __init__(self, status, headers, body):
        self.status_code = status
        self.headers = Headers(headers)
        ct = self.headers.get("content-type", "")
        self.content_type = ct.lower()
        self.data = body
        self.sock = None

    def header(self, name):
        return self.headers.get(name)

    def json(self):
        return json.loads(self.data)


def http(addr, method, target, headers=(), body=b"", stream_for=None, keep=False, timeout=20, expect_continue=False,
         until=None):
    """One request on a connection of its own; the answer's head, and its body read to its end (a
    stream: for `stream_for` seconds, or until its body holds `until`). With `keep` the socket stays
    open (`.sock`). With `expect_continue` the body waits for `100 Continue` (a refusal comes before
    it is sent)."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    if isinstance(body, str):
        body = body.encode()
    lines = [f"{method} {target} HTTP/1.1", f"host: {addr}"]
    names = {k.lower() for k, _ in headers}
    lines += [f"{k}: {v}" for k, v in headers]
    if body or method in ("POST", "PUT"):
        lines.append(f"content-length: {len(body)}")
    if "connection" not in names and not keep:
        lines.append("connection: close")
    if expect_continue:
        lines.append("expect: 100-continue")
    head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    s.sendall(head_bytes if expect_continue else head_bytes + body)

    def read_head(buf):
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                raise ConnectionError(f"{method} {target}: closed before the answer's head ({buf!r})")
            buf += d
        return buf.split(b"\r\n\r\n", 1)

    head, rest = read_head(b"")
    if expect_continue and head.split(b" ", 2)[1] == b"100":
        s.sendall(body)
        head, rest = read_head(rest)
    hl = head.decode("latin-1").split("\r\n")
    status = int(hl[0].split(" ", 2)[1])
    hdrs = [(k.strip(), v.strip()) for k, v in (x.split(":", 1) for x in hl[1:])]
    r = RawResponse(status, hdrs, b"")
    r.keep = keep
    if status in (101, 204, 304):
        r.data = b"" if status != 101 else rest
        if keep or status == 101:
            r.sock = s
        else:
            s.close()
        return r
    deadline = time.monotonic() + (stream_for if stream_for is not None else timeout)

    def more():
        left = deadline - time.monotonic()
        if left <= 0:
            return b""
        s.settimeout(left)
        try:
            return s.recv(65536)
        except (socket.timeout, TimeoutError, ConnectionResetError):
            return b""

    cl = r.header("content-length")
    if cl is not None:
        n = int(cl)
        while len(rest) < n:
            d = more()
            if not d:
                break
            rest += d
        r.data = rest[:n]
    elif "chunked" in (r.header("transfer-encoding") or "").lower():
        out, raw = b"", rest
        while True:
            while b"\r\n" not in raw:
                d = more()
                if not d:
                    break
                raw += d
            if b"\r\n" not in raw:
                break
            line, raw = raw.split(b"\r\n", 1)
            size = int(line.split(b";")[0], 16)
            if size == 0:
                break
            while len(raw) < size + 2:
                d = more()
                if not d:
                    break
                raw += d
            out += raw[:size]
            raw = raw[size + 2:]
            if until is not None and until in out:
                break
        r.data = out
    else:
        while until is None or until not in rest:
            d = more()
            if not d:
                break
            rest += d
        r.data = rest
    if keep:
        r.sock = s
    else:
        s.close()
    return r


def ws_headers(protocol=True, version="13"):
    h = [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", base64.b64encode(os.urandom(16)).decode()),
        ("Sec-WebSocket-Version", version),
    ]
    if protocol:
        h.append(("Sec-WebSocket-Protocol", "cloudevents.json"))
    return h


def describe_schema_error(e):
    errors = getattr(e, "schema_errors", None)
    if errors:
        return "; ".join(f"{'/'.join(str(p) for p in se.absolute_path) or '<root>'}: {se.message[:200]}"
                         for se in list(errors)[:4])
    return str(e)[:300]


def describe(e):
    """An openapi-core error, with the schema errors under it."""
    cause = e.__cause__
    name = type(e).__name__
    errors = getattr(cause, "schema_errors", None) if cause is not None else None
    if errors:
        parts = []
        for se in list(errors)[:4]:
            path = "/".join(str(p) for p in getattr(se, "absolute_path", getattr(se, "path", ())))
            parts.append(f"{path or '<root>'}: {getattr(se, 'message', str(se))[:240]}")
        return f"{name}: " + "; ".join(parts)
    text = str(cause) if cause is not None else str(e)
    return f"{name}: {text[:400]}"


class Checker:
    def __init__(self, root, traffic, admin):
        self.root, self.addr = root, {"traffic": traffic, "admin": admin}
        self.doc_path = os.path.join(root, "openapi", "evmesh.yaml")
        with open(self.doc_path, "rb") as f:
            self.doc_bytes = f.read()
        self.doc = yaml.safe_load(self.doc_bytes)
        self.failures = []
        self.notes = []
        self.driven = {}  # (path, method) -> {"ok": n, "refusal": n}
        self.contradictions_seen = set()
        try:
            validate_spec(self.doc)
        except Exception as e:  # noqa: BLE001 - any finding of the spec validator is a failure
            self.fail("document", "-", "-", f"not a valid OpenAPI 3.1 document: {e}")
        self.spec = SchemaPath.from_file_path(self.doc_path)
        self.req_validator = V31RequestValidator(self.spec, extra_media_type_deserializers=EXTRA_DESERIALIZERS)
        self.resp_validator = V31ResponseValidator(self.spec, extra_media_type_deserializers=EXTRA_DESERIALIZERS)
        self.run_id = f"{int(time.time() * 1000) % 10**9:09d}"

    # ------------------------------------------------------------------ bookkeeping
    def fail(self, path, method, status, message):
        self.failures.append(f"{path} {method.upper() if isinstance(method, str) else method} -> {status}: {message}")

    def operations(self):
        for path, item in self.doc["paths"].items():
            for m in METHODS:
                if m in item:
                    yield path, m

    def template(self, listener, method, target):
        url = DOC_SERVER[listener] + urlsplit(target).path
        try:
            found = self.req_validator.path_finder.find(method.lower(), url)
        except PathError as e:
            return None, e
        return found.path_result.pattern, None

    def name(self, base):
        return f"oa-{self.run_id}-{base}"

    # ------------------------------------------------------------------ one exchange
    def send(self, listener, method, target, headers=(), body=b"", **opts):
        headers = list(headers)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            if not any(k.lower() == "content-type" for k, _ in headers):
                headers.append(("content-type", "application/json"))
        elif isinstance(body, str):
            body = body.encode()
        resp = http(self.addr[listener], method, target, headers, body, **opts)
        return (listener, method, target, headers, body), resp

    def check(self, exchange, resp, expect, request="valid", refusal=None, note=""):
        """Validates one exchange. `expect`: the status (or statuses) the broker must answer.
        `request`: "valid" (the document must accept the request), "invalid" (it must reject it:
        the broker refuses what the document says is wrong) or "any" (the document cannot say).
        `refusal`: whether this is a refusal (default: status >= 400)."""
        listener, method, target, headers, body = exchange
        status = resp.status_code
        path, err = self.template(listener, method, target)
        where = path or urlsplit(target).path
        label = f"{where} {method}" + (f" ({note})" if note else "")
        expected = expect if isinstance(expect, (set, tuple, list)) else {expect}
        if status not in expected:
            detail = resp.data[:300].decode("utf-8", "replace") if resp.data else ""
            why = f" ({note})" if note else ""
            self.fail(where, method, status, f"expected {sorted(expected)}{why}: {detail}")
        if path is None:
            self.fail(where, method, status, f"not in the document: {err}")
            return resp
        key = (path, method.lower())
        counts = self.driven.setdefault(key, {"ok": 0, "refusal": 0})
        is_refusal = refusal if refusal is not None else status >= 400
        counts["refusal" if is_refusal else "ok"] += 1

        req = RawRequest(listener, method, target, headers, body)
        req_errors = [describe(e) for e in self.req_validator.iter_errors(req)]
        if request == "valid" and req_errors:
            self.fail(path, method, status, f"request rejected by the document ({label}): {'; '.join(req_errors)}")
        elif request == "invalid" and not req_errors:
            self.fail(path, method, status, f"the broker refused ({label}) a request the document accepts")

        if status == 101:
            self.check_upgrade(path, method, resp)
            return resp
        resp_errors = [describe(e) for e in self.resp_validator.iter_errors(req, resp)]
        contradiction = SPEC_CONTRADICTIONS.get((path, method.lower(), status))
        if contradiction:
            self.contradictions_seen.add((path, method.lower(), status))
            if not resp_errors:
                self.fail(path, method, status,
                          f"listed as a SPEC contradiction but the answer now validates: {contradiction}")
            else:
                self.notes.append(f"SPEC contradiction (document keeps SPEC's shape): {path} {method.upper()} -> "
                                  f"{status}: {contradiction}")
        elif resp_errors:
            self.fail(path, method, status, f"answer rejected by the document ({label}): {'; '.join(resp_errors)}")
        schema = SSE_DATA.get(key)
        if schema and status == 200:
            self.check_sse(path, method, schema, resp.data)
        return resp

    def check_sse(self, path, method, schema, data):
        """Each `data:` line of a server-sent event stream, against a schema of the document."""
        validator = oas31_schema_validators_factory.create(self.spec, self.spec / "components" / "schemas" / schema)
        lines = [line[5:].strip() for line in data.decode("utf-8", "replace").split("\n") if line.startswith("data:")]
        if not lines:
            self.fail(path, method, 200, "no event in the stream")
        for line in lines:
            try:
                validator.validate(json.loads(line))
            except Exception as e:  # noqa: BLE001 - the schema error, or JSON that is not
                self.fail(path, method, 200, f"an event of the stream is not a {schema}: {describe_schema_error(e)}")

    def call(self, listener, method, target, expect, headers=(), body=b"", request="valid", refusal=None, note="",
             **opts):
        exchange, resp = self.send(listener, method, target, headers, body, **opts)
        return self.check(exchange, resp, expect, request=request, refusal=refusal, note=note)

    def check_upgrade(self, path, method, resp):
        """A 101 by hand: documented for the operation, with its required headers and values."""
        responses = self.doc["paths"][path][method.lower()]["responses"]
        documented = responses.get("101") or responses.get(101)
        if not documented:
            self.fail(path, method, 101, "101 is not documented")
            return
        if "$ref" in documented:
            documented = self.doc["components"]["responses"][documented["$ref"].rsplit("/", 1)[1]]
        for name, h in documented.get("headers", {}).items():
            value = resp.header(name)
            schema = h.get("schema", {})
            if value is None:
                if h.get("required"):
                    self.fail(path, method, 101, f"header {name} missing")
                continue
            if "const" in schema and value.lower() != str(schema["const"]).lower():
                self.fail(path, method, 101, f"header {name}: {value!r}, documented {schema['const']!r}")
        if resp.sock and not getattr(resp, "keep", False):
            resp.sock.close()

    # ------------------------------------------------------------------ the drive
    def run(self):
        self.probes()
        self.events()
        self.request_reply()
        self.sessions()
        self.agents_and_turns()
        self.a2a()
        self.classic()
        self.admin_storage()
        self.admin_governance()
        self.wrong_methods()
        self.coverage()

    def probes(self):
        self.call("admin", "GET", "/healthz", 200)
        self.call("admin", "GET", "/readyz", 200)
        r = self.call("admin", "GET", "/metrics", 200)
        if b"evmesh_events_published_total" not in r.data:
            self.fail("/metrics", "get", 200, "no evmesh_events_published_total")
        r = self.call("admin", "GET", "/openapi.yaml", 200)
        # The binary serves the document compiled in when it was built: YAML of OpenAPI 3.1.0
        # here; once the broker is rebuilt it is this very file (the Rust test
        # openapi_document_matches_every_answer compares the bytes).
        try:
            served = yaml.safe_load(r.data)
            if not isinstance(served, dict) or served.get("openapi") != "3.1.0":
                self.fail("/openapi.yaml", "get", 200, "the served document is not OpenAPI 3.1.0")
        except yaml.YAMLError as e:
            self.fail("/openapi.yaml", "get", 200, f"the served document is not YAML: {e}")
        if r.data != self.doc_bytes:
            self.notes.append("GET /openapi.yaml serves another copy than openapi/evmesh.yaml (a binary built before "
                              "the document changed: rebuild to serve it)")
        self.call("admin", "GET", "/console", 200)
        for f in ("console.js", "console.css", "index.html"):
            self.call("admin", "GET", f"/console/{f}", 200)
        self.call("admin", "GET", "/console/nothing.js", 404, request="invalid")

    def events(self):
        topic, sub = self.name("orders"), self.name("billing")
        ce = {"content-type": "application/cloudevents+json"}
        ev = lambda i, **kw: dict({"specversion": "1.0", "id": f"e-{i}", "source": "/oa", "type": "com.oa.order"}, **kw)
        # Subscribe first (start earliest), then publish in every content mode.
        self.call("traffic", "POST", "/events/subscribe", 201,
                  body={"subscription": sub, "topic": topic, "start": "earliest",
                        "filters": [{"prefix": {"type": "com.oa."}}, {"not": {"exact": {"subject": "skip"}}},
                                    {"any": [{"sql": "type LIKE 'com.%'"}, {"suffix": {"type": ".order"}}]}]})
        self.call("traffic", "POST", "/events/subscribe", 200, note="the same definition",
                  body={"subscription": sub, "topic": topic, "start": "earliest", "mode": "LOAD_BALANCE",
                        "ackTimeoutMs": 30000, "maxAttempts": 6,
                        "filters": [{"prefix": {"type": "com.oa."}}, {"not": {"exact": {"subject": "skip"}}},
                                    {"any": [{"sql": "type LIKE 'com.%'"}, {"suffix": {"type": ".order"}}]}]})
        self.call("traffic", "POST", "/events/subscribe", 409, note="another definition",
                  body={"subscription": sub, "topic": topic, "start": "latest"})
        self.call("traffic", "POST", "/events/subscribe", 400, request="invalid", note="unknown dialect",
                  body={"subscription": self.name("x"), "topic": topic, "filters": [{"regex": {"type": "x"}}]})
        self.call("traffic", "POST", "/events/subscribe", 400, request="any", note="CESQL that does not parse",
                  body={"subscription": self.name("x"), "topic": topic, "filters": [{"sql": "type = "}]})
        self.call("traffic", "POST", "/events/subscribe", 400, request="invalid", note="unknown field",
                  body={"subscription": self.name("x"), "topic": topic, "colour": "red"})
        self.call("traffic", "POST", "/events/subscribe", 400, request="invalid", note="maxAttempts out of range",
                  body={"subscription": self.name("x"), "topic": topic, "maxAttempts": 0})

        pub = f"/events/publish?topic={topic}"
        self.call("traffic", "POST", pub, 202, headers=ce.items(),
                  body=json.dumps(ev(1, partitionkey="c42", data={"sku": "A-1"}, amount=120, vip=True)))
        self.call("traffic", "POST", pub, 202, headers=[("content-type", "application/cloudevents-batch+json")],
                  body=json.dumps([ev(2), ev(3, data_base64="AAEC")]), note="batch")
        self.call("traffic", "POST", pub, 202, note="binary mode",
                  headers=[("ce-specversion", "1.0"), ("ce-id", "e-4"), ("ce-source", "/oa"),
                           ("ce-type", "com.oa.order"), ("ce-subject", "50%"), ("content-type", "text/plain")],
                  body="hello")
        self.call("traffic", "POST", "/events/publish", 400, headers=ce.items(), body=json.dumps(ev(5)),
                  request="invalid", note="no ?topic=")
        self.call("traffic", "POST", pub, 400, headers=ce.items(), body=json.dumps(ev(5, specversion="0.3")),
                  request="invalid", note="specversion 0.3")
        self.call("traffic", "POST", pub, 400, headers=ce.items(), body=json.dumps({"specversion": "1.0", "id": "x"}),
                  request="invalid", note="no source, no type")
        self.call("traffic", "POST", pub, 400, headers=ce.items(), body=json.dumps(ev(5, Bad_Name="x")),
                  request="invalid", note="attribute name not [a-z0-9]+")
        self.call("traffic", "POST", pub, 415, headers=[("content-type", "text/plain")], body="not an event",
                  request="any", note="no ce-* headers")
        self.call("traffic", "POST", pub, 415, headers=[("content-type", "application/cloudevents+xml")],
                  body="<e/>", request="any", note="an event format other than JSON")
        self.call("traffic", "POST", pub, 413, headers=ce.items(), body=b"a" * (1024 * 1024 + 10),
                  request="any", note="over max_body_bytes", expect_continue=True)
        self.call("traffic", "POST", pub, 431, headers=list(ce.items()) + [("x-padding", "a" * 20000)],
                  body=json.dumps(ev(6)), request="any", note="headers over max_header_bytes")

        # Long-poll, ack, SSE.
        poll = f"/events/poll?subscription={sub}&max=10&waitMs=2000"
        r = self.call("traffic", "GET", poll, 200)
        ids = [e["emdeliveryid"] for e in r.json()] if r.status_code == 200 else []
        self.call("traffic", "POST", "/events/ack", 200, body={"subscription": sub, "ids": ids})
        self.call("traffic", "POST", "/events/ack", 200, body={"subscription": sub, "ids": ids[:1], "nack": True},
                  note="nack")
        self.call("traffic", "POST", "/events/ack", 400, body={"subscription": sub, "ids": ["99:0:1"]},
                  request="any", note="a partition the topic does not have")
        self.call("traffic", "POST", "/events/ack", 400, body={"subscription": sub}, request="invalid", note="no ids")
        self.call("traffic", "POST", "/events/ack", 404, body={"subscription": self.name("nope"), "ids": []})
        self.call("traffic", "GET", f"/events/poll?subscription={sub}&max=10&waitMs=0", (200, 204),
                  note="the nacked event again, or nothing yet")
        self.call("traffic", "GET", f"/events/poll?subscription={sub}&max=0", 400, request="invalid", note="max=0")
        self.call("traffic", "GET", f"/events/poll?subscription={sub}&max=1001", 400, request="invalid",
                  note="max over 1000")
        self.call("traffic", "GET", f"/events/poll?subscription={sub}&max=1000&waitMs=0", (200, 204),
                  note="the bounds themselves")
        self.call("traffic", "GET", f"/events/poll?subscription={sub}&waitMs=60001", 400, request="invalid",
                  note="waitMs over 60000")
        self.call("traffic", "GET", f"/events/poll?subscription={self.name('nope')}", 404)
        self.call("traffic", "GET", "/events/poll", 400, request="invalid", note="no ?subscription=")
        empty = self.name("empty")
        self.call("traffic", "POST", "/events/subscribe", 201,
                  body={"subscription": empty, "topic": self.name("quiet")})
        self.call("traffic", "GET", f"/events/poll?subscription={empty}&waitMs=0", 204)
        bsub = self.name("fanout")
        self.call("traffic", "POST", "/events/subscribe", 201,
                  body={"subscription": bsub, "topic": topic, "mode": "BROADCAST", "start": {"offset": 0}})
        self.call("traffic", "GET", f"/events/poll?subscription={bsub}&waitMs=0", 400, request="any",
                  note="BROADCAST without clientId")
        self.call("traffic", "GET", f"/events/poll?subscription={bsub}&clientId=c-1&waitMs=1000", 200)
        msub = self.name("multi")
        self.call("traffic", "POST", "/events/subscribe", 201,
                  body={"subscription": msub, "topic": topic, "mode": "MULTICAST",
                        "start": {"time": "2020-01-01T00:00:00Z"}})

        # SSE sessions, each with events waiting (an empty stream has nothing to validate).
        sse = self.name("sse")
        self.call("traffic", "POST", "/events/subscribe", 201, body={"subscription": sse, "topic": topic,
                                                                     "start": "earliest"})
        r = self.call("traffic", "GET", f"/events/sse?subscription={sse}", 200, **SSE)
        if b"emdeliveryid" not in r.data:
            self.fail("/events/sse", "get", 200, f"no event delivered: {r.data[:200]!r}")
        self.call("traffic", "GET", f"/events/sse?subscription={bsub}&clientId=c-2&credit=16", 200, **SSE)
        filters = json.dumps([{"exact": {"type": "com.oa.order"}}])
        self.call("traffic", "GET", f"/events/sse?subscription={msub}&clientId=c-3&sql=amount%20%3E%20100"
                  f"&filters={quote(filters)}", 200, **SSE, note="MULTICAST session filters")
        self.call("traffic", "GET", f"/events/sse?subscription={sub}&credit=4097", 400, request="invalid",
                  note="credit over 4096")
        self.call("traffic", "GET", f"/events/sse?subscription={sub}&ack=none", 400, request="any",
                  note="ack=none on SSE")
        self.call("traffic", "GET", f"/events/sse?subscription={self.name('nope')}", 404)
        self.call("traffic", "GET", f"/events/sse?subscription={sub}&filters=%5B%5D&sql=x", 400, request="any",
                  note="session filters on a LOAD_BALANCE subscription")

        # WebSocket delivery and publish: the refusals, and the 101 (checked by hand).
        self.call("traffic", "GET", f"/events/ws?subscription={sub}", 101, headers=ws_headers())
        self.call("traffic", "GET", f"/events/ws?subscription={sub}&credit=4096", 101, headers=ws_headers(),
                  note="the largest window")
        self.call("traffic", "GET", f"/events/ws?subscription={sub}&credit=0", 101, headers=ws_headers(),
                  note="paused")
        self.call("traffic", "GET", f"/events/ws?subscription={bsub}&ack=none", 101, headers=ws_headers(False),
                  note="live fan-out, no subprotocol asked")
        self.call("traffic", "GET", f"/events/ws?publish={topic}", 101, headers=ws_headers(), note="publisher")
        self.call("traffic", "GET", "/events/ws", 400, headers=ws_headers(), request="any",
                  note="neither ?subscription= nor ?publish=")
        self.call("traffic", "GET", f"/events/ws?subscription={sub}", 400, request="invalid",
                  note="not an upgrade")
        self.call("traffic", "GET", f"/events/ws?subscription={sub}&ack=none", 400, headers=ws_headers(),
                  request="any", note="ack=none on LOAD_BALANCE")
        self.call("traffic", "GET", f"/events/ws?subscription={sub}&credit=-1", 400, headers=ws_headers(),
                  request="invalid", note="credit below 0")
        self.call("traffic", "GET", f"/events/ws?publish=bad%20name", 400, headers=ws_headers(), request="invalid")
        self.call("traffic", "GET", f"/events/ws?subscription={self.name('nope')}", 404, headers=ws_headers())
        self.call("traffic", "GET", f"/events/ws?subscription={sub}", 426, headers=ws_headers(version="8"),
                  request="any", note="WebSocket version 8")

        # A webhook subscription: sessions cannot attach to it nor ack it (409). The sink is an
        # address nobody listens on (no event is published to its topic).
        hook = self.name("hook")
        self.call("traffic", "POST", "/events/subscribe", 201,
                  body={"subscription": hook, "topic": self.name("hooked"), "sink": "http://127.0.0.1:9/in",
                        "sinkSecret": "s3cret"})
        self.call("traffic", "GET", f"/events/ws?subscription={hook}", 409, headers=ws_headers())
        self.call("traffic", "GET", f"/events/sse?subscription={hook}", 409)
        self.call("traffic", "GET", f"/events/poll?subscription={hook}&waitMs=0", 409)
        self.call("traffic", "POST", "/events/ack", 409, body={"subscription": hook, "ids": []})

        # A rate limit on a topic of its own: 429 with Retry-After.
        limited = self.name("limited")
        lid = self.name("limit")
        self.call("admin", "PUT", f"/admin/limits/{lid}", 201,
                  body={"scope": f"topic:{limited}", "eventsPerSecond": 1, "burst": 1})
        self.call("traffic", "POST", f"/events/publish?topic={limited}", 202, headers=ce.items(),
                  body=json.dumps(ev(7)))
        self.call("traffic", "POST", f"/events/publish?topic={limited}", 429, headers=ce.items(),
                  body=json.dumps(ev(8)), note="over the limit")
        self.call("admin", "DELETE", f"/admin/limits/{lid}", 200)

        # Unsubscribe.
        self.call("traffic", "POST", "/events/unsubscribe", 200, body={"subscription": empty})
        self.call("traffic", "POST", "/events/unsubscribe", 404, body={"subscription": empty})
        self.call("traffic", "POST", "/events/unsubscribe", 400, body={"name": empty}, request="invalid")
        self.sub, self.topic, self.hook = sub, topic, hook

    def request_reply(self):
        topic, sub = self.name("quotes"), self.name("pricing")
        ce = [("content-type", "application/cloudevents+json")]
        req_ev = {"specversion": "1.0", "id": "q-1", "source": "/oa", "type": "com.oa.quote", "data": {"sku": "A-1"}}
        self.call("traffic", "POST", "/events/subscribe", 201, body={"subscription": sub, "topic": topic})

        def respond(binary):
            # The responder: takes the request from the subscription, replies to it.
            r = self.call("traffic", "GET", f"/events/poll?subscription={sub}&max=1&waitMs=5000", 200)
            if r.status_code != 200:
                return
            got = r.json()[0]
            self.call("traffic", "POST", "/events/ack", 200, body={"subscription": sub, "ids": [got["emdeliveryid"]]})
            reply = {"specversion": "1.0", "id": "p-1", "source": "/pricing", "type": "com.oa.price",
                     "emcorrelationid": got.get("emcorrelationid", ""), "data": {"price": 42}}
            if binary:
                self.call("traffic", "POST", "/events/reply", 202, note="binary mode",
                          headers=[("ce-specversion", "1.0"), ("ce-id", "p-2"), ("ce-source", "/pricing"),
                                   ("ce-type", "com.oa.price"), ("ce-emcorrelationid", reply["emcorrelationid"]),
                                   ("content-type", "application/json")], body=json.dumps({"price": 43}))
            else:
                self.call("traffic", "POST", "/events/reply", 202, headers=ce, body=json.dumps(reply))

        for binary, accept in ((False, None), (True, "application/json")):
            out = {}
            headers = ce + ([("accept", accept)] if accept else [])

            def requester():
                out["x"] = self.send("traffic", "POST", f"/events/request?topic={topic}&timeoutMs=10000",
                                     headers, json.dumps(req_ev))

            t = threading.Thread(target=requester)
            t.start()
            time.sleep(0.2)
            respond(binary)
            t.join(15)
            if "x" in out:
                self.check(*out["x"], 200, note="binary-mode reply" if binary else "structured reply")
            else:
                self.fail("/events/request", "post", "-", "no answer to the request")
        self.call("traffic", "POST", f"/events/request?topic={topic}&timeoutMs=300", 504, headers=ce,
                  body=json.dumps(req_ev), note="nobody replies")
        self.call("traffic", "POST", f"/events/request?topic={topic}&timeoutMs=0", 400, headers=ce,
                  body=json.dumps(req_ev), request="invalid", note="timeoutMs=0")
        self.call("traffic", "POST", f"/events/request?topic={topic}", 400,
                  headers=[("content-type", "application/cloudevents-batch+json")], body=json.dumps([req_ev]),
                  request="any", note="a batch")
        self.call("traffic", "POST", f"/events/request?topic={topic}", 415, headers=[("content-type", "text/plain")],
                  body="x", request="any")
        # Drain what the refused and timed-out requests left (nobody waits for them any more).
        self.send("traffic", "GET", f"/events/poll?subscription={sub}&max=10&waitMs=0")
        reply = dict(req_ev, emcorrelationid="1.0.0.0.0.0123456789abcdef")
        self.call("traffic", "POST", "/events/reply", 404, headers=ce, body=json.dumps(reply), note="nobody waits")
        self.call("traffic", "POST", "/events/reply", 400, headers=ce, body=json.dumps(req_ev), request="any",
                  note="no emcorrelationid")
        self.call("traffic", "POST", "/events/reply", 415, headers=[("content-type", "text/plain")], body="x",
                  request="any")

    def sessions(self):
        ce = [("content-type", "application/cloudevents+json")]
        sid = f"chat-{self.run_id}"
        ev = {"specversion": "1.0", "id": "m-1", "source": "/alice", "type": "chat.message", "data": {"text": "hi"}}
        self.call("traffic", "POST", f"/session/publish/{sid}", 201, headers=ce, body=json.dumps(ev))
        self.call("traffic", "POST", f"/session/publish/{sid}", 201,
                  headers=[("content-type", "application/cloudevents-batch+json")],
                  body=json.dumps([dict(ev, id="m-2"), dict(ev, id="m-3")]), note="batch")
        self.call("traffic", "POST", f"/session/publish/{sid}", 415, headers=[("content-type", "text/plain")],
                  body="x", request="any")
        self.call("traffic", "POST", "/session/publish/bad%20id", 400, headers=ce, body=json.dumps(ev),
                  request="invalid")
        self.call("traffic", "POST", f"/session/publish/{sid}", 400, headers=ce, body=json.dumps({"id": "x"}),
                  request="invalid", note="not a CloudEvent")
        # The one subscriber (SSE, kept open), then a second one: 409.
        first = self.call("traffic", "GET", f"/session/subscribe/{sid}", 200, **SSE, keep=True)
        if b"emoffset" not in first.data:
            self.fail("/session/subscribe/{sid}", "get", 200, f"no event replayed: {first.data[:200]!r}")
        time.sleep(0.1)
        self.call("traffic", "GET", f"/session/subscribe/{sid}", 409, note="a second subscriber")
        if first.sock:
            first.sock.close()
        self.call("traffic", "GET", f"/session/subscribe/{sid}-ws", 101, headers=ws_headers(), note="WebSocket")
        self.call("traffic", "GET", "/session/subscribe/bad%20id", 400, request="invalid")
        self.call("traffic", "GET", f"/session/subscribe/{sid}-x", 400, headers=[("last-event-id", "x")],
                  request="invalid", note="Last-Event-ID not an offset")
        self.call("traffic", "GET", f"/session/recommend?sessionId={sid}", 200)
        self.call("traffic", "GET", f"/session/recommend?subscription={self.sub}", 200)
        self.call("traffic", "GET", "/session/recommend?clientId=me", 200)
        self.call("traffic", "GET", "/session/recommend", 400, request="any", note="nothing named")
        self.call("traffic", "GET", "/session/recommend?clientId=me&subscription=x", 400, request="any",
                  note="two named")

    def agents_and_turns(self):
        json_ct = [("content-type", "application/json")]
        agent, idle = self.name("bot"), self.name("idle")
        self.call("traffic", "POST", "/agent/register", 201, body={"agentId": agent})
        self.call("traffic", "POST", "/agent/register", 200, body={"agentId": agent}, note="again")
        self.call("traffic", "POST", "/agent/register", 400, body={"agentId": "bad id"}, request="invalid")
        self.call("traffic", "POST", "/agent/register", 201, body={"agentId": idle, "ready": False})
        self.call("traffic", "POST", "/agent/heartbeat", 200, body={"agentId": agent})
        self.call("traffic", "POST", "/agent/heartbeat", 404, body={"agentId": self.name("nobody")})
        self.call("traffic", "POST", "/agent/heartbeat", 400, body={"ready": True}, request="invalid",
                  note="no agentId")
        self.call("traffic", "POST", "/session/open", 503, body={"clientId": "me", "agentId": idle},
                  note="agent not ready")
        self.call("traffic", "POST", "/agent/deregister", 200, body={"agentId": idle})
        self.call("traffic", "POST", "/agent/deregister", 404, body={"agentId": idle})
        # A remote A2A server registered by URL (nobody listens there: its card is not fetched).
        remote = self.name("remote")
        self.call("traffic", "POST", "/agent/register", 201,
                  body={"agentId": remote, "a2aUrl": "http://127.0.0.1:9/a2a"}, note="a remote A2A server")
        self.call("traffic", "POST", "/agent/register", 400, body={"agentId": remote, "a2aUrl": "ftp://127.0.0.1/"},
                  request="any", note="a2aUrl not http(s)")
        self.call("traffic", "POST", "/agent/deregister", 200, body={"agentId": remote}, note="a remote A2A server")
        # The agent attaches (raw WebSocket, kept open while its turns run) and answers with HTTP chunks.
        ws = self.call("traffic", "GET", f"/agent/ws?agentId={agent}", 101, headers=ws_headers(), keep=True)
        agent_sock = ws.sock
        ws.sock = None
        self.call("traffic", "GET", f"/agent/ws?agentId={agent}", 409, headers=ws_headers(), note="a second connection")
        self.call("traffic", "GET", "/agent/ws", 400, headers=ws_headers(), request="invalid", note="no ?agentId=")
        r = self.call("traffic", "POST", "/session/open", 201, body={"clientId": "me", "agentId": agent})
        sid = r.json()["sessionId"] if r.status_code == 201 else f"{agent}:00000000-0000-4000-8000-000000000000"
        self.call("traffic", "POST", "/session/open", 201, body={"clientId": "me"}, note="any attached agent")
        self.call("traffic", "POST", "/session/open", 400, body={"agentId": agent}, request="invalid",
                  note="no clientId")

        seen = {"requests": 0, "buf": b""}

        def wait_turn():
            """Reads the agent's WebSocket until one more turn request arrived (the turn is in
            progress then); server frames are unmasked, so the event's JSON is in the bytes."""
            want = seen["requests"] + 1
            agent_sock.settimeout(10)
            while seen["buf"].count(b'"type":"evmesh.stream.request"') < want:
                d = agent_sock.recv(65536)
                if not d:
                    raise ConnectionError("the agent's WebSocket closed")
                seen["buf"] += d
            seen["requests"] = want

        def turn(chunks, then=None, note="", query=""):
            """A turn: its stream read while `chunks` are POSTed (or `then` runs)."""
            results = []

            def agent_side():
                wait_turn()
                for c in chunks:
                    results.append(self.send("traffic", "POST", f"/session/chunk/{sid}", json_ct, json.dumps(c)))
                if then:
                    results.append(then())

            t = threading.Thread(target=agent_side)
            t.start()
            stream = self.send("traffic", "POST", f"/session/stream/{sid}{query}", [("content-type", "text/plain")],
                               "tell me a story", stream_for=5)
            t.join(10)
            self.check(*stream, 200, note=note)
            return stream[1], results

        stream, results = turn([{"seq": 0, "data": "once", "done": False},
                                {"type": "chunk", "sessionId": sid, "seq": 1, "data": {"upon": "a time"},
                                 "done": True}],
                               note="chunks", query="?model=m-1&conversation=c-1")
        for ex in results:
            self.check(*ex, 200)
        if b"event: done" not in stream.data:
            self.fail("/session/stream/{sid}", "post", 200, f"no `event: done` in {stream.data[:300]!r}")
        self.call("traffic", "POST", f"/session/chunk/{sid}", 409, headers=json_ct,
                  body=json.dumps({"seq": 2, "data": "late", "done": True}), note="no turn in progress")
        self.call("traffic", "POST", f"/session/chunk/{sid}", 400, headers=json_ct,
                  body=json.dumps({"sessionId": "other:1234", "data": "x"}), request="any", note="another session's id")
        self.call("traffic", "POST", "/session/chunk/not-a-session", 400, headers=json_ct,
                  body=json.dumps({"data": "x"}), request="invalid")
        self.call("traffic", "GET", f"/session/stream/{sid}", 200, stream_for=1, note="resume the last turn")
        self.call("traffic", "GET", f"/session/stream/{sid}", 204, headers=[("last-event-id", "1")],
                  note="nothing more")
        self.call("traffic", "GET", f"/session/stream/{sid}?turn=7", 204, note="not the current turn")
        self.call("traffic", "GET", f"/session/stream/{sid}", 400, headers=[("last-event-id", "x")], request="invalid")
        self.call("traffic", "POST", f"/session/cancel/{sid}", 409, note="no turn in progress")
        self.call("traffic", "POST", f"/session/end-turn/{sid}", 409, note="no turn in progress")

        # A turn cancelled (its stream ends with `event: error`), then one ended by the client.
        busy = []

        def cancel_it():
            busy.append(self.send("traffic", "POST", f"/session/stream/{sid}", [("content-type", "text/plain")], "x"))
            return self.send("traffic", "POST", f"/session/cancel/{sid}")

        stream, results = turn([], then=cancel_it, note="cancelled")
        for ex in busy:
            self.check(*ex, 409, note="a turn is in progress")
        for ex in results:
            self.check(*ex, 200)
        if b"event: error" not in stream.data:
            self.fail("/session/stream/{sid}", "post", 200, f"no `event: error` in {stream.data[:300]!r}")
        stream, results = turn([], then=lambda: self.send("traffic", "POST", f"/session/end-turn/{sid}"), note="ended")
        for ex in results:
            self.check(*ex, 200)
        self.call("traffic", "POST", f"/session/close/{sid}", 200)
        self.call("traffic", "POST", f"/session/close/{sid}", 404)
        self.call("traffic", "POST", f"/session/end-turn/{sid}", 404)
        self.call("traffic", "POST", f"/session/cancel/{sid}", 404)
        self.call("traffic", "POST", f"/session/chunk/{sid}", 404, headers=json_ct, body=json.dumps({"data": "x"}))
        self.call("traffic", "POST", f"/session/stream/{sid}", 404, headers=[("content-type", "text/plain")], body="x")
        self.call("traffic", "GET", f"/session/stream/{sid}", 404)
        self.call("traffic", "POST", "/session/close/not-a-session", 400, request="invalid")
        self.call("traffic", "POST", "/session/end-turn/not-a-session", 400, request="invalid")
        self.call("traffic", "POST", "/session/cancel/not-a-session", 400, request="invalid")
        self.call("traffic", "POST", "/session/stream/not-a-session", 400, request="invalid")
        self.agent, self.agent_sock = agent, agent_sock

    def a2a(self):
        agent = self.agent
        v = [("A2A-Version", "1.0"), ("content-type", "application/json")]
        base = f"/a2a/{agent}"
        self.call("traffic", "GET", f"{base}/.well-known/agent-card.json", 200)
        self.call("traffic", "GET", "/a2a/bad%20id/.well-known/agent-card.json", 400, request="invalid")

        def message(mid, immediately=True):
            m = {"message": {"messageId": mid, "role": "ROLE_USER", "parts": [{"text": "hello"}]}}
            if immediately:
                m["configuration"] = {"returnImmediately": True}
            return m

        def rpc(i, method, params):
            return json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params})

        r = self.call("traffic", "POST", base, 200, headers=v, body=rpc(1, "SendMessage", message("m-1")))
        task = (r.json().get("result") or {}).get("task", {}).get("id", "none") if r.status_code == 200 else "none"
        if task == "none":
            self.fail(base, "post", r.status_code, f"SendMessage made no task: {r.data[:300]!r}")
        self.call("traffic", "POST", base, 200, headers=v, body=rpc(2, "GetTask", {"id": task}))
        self.call("traffic", "POST", base, 200, headers=v, body=rpc(3, "ListTasks", {}))
        self.call("traffic", "POST", base, 200, headers=v, body=rpc(4, "SubscribeToTask", {"id": task}), **SSE)
        self.call("traffic", "POST", base, 200, headers=v, body=rpc(5, "SendStreamingMessage", message("m-2", False)),
                  **SSE)
        rpc_error = lambda r: r.status_code == 200 and "error" in r.json()
        r = self.call("traffic", "POST", base, 200, headers=v, body=rpc(6, "GetTask", {"id": "nope"}), refusal=True,
                      note="task not found")
        if not rpc_error(r):
            self.fail(base, "post", r.status_code, "GetTask of an unknown task is not a JSON-RPC error")
        r = self.call("traffic", "POST", base, 200, headers=[("content-type", "application/json")],
                      body=rpc(7, "GetTask", {"id": task}), refusal=True, note="no A2A-Version")
        if not rpc_error(r) or r.json()["error"]["code"] != -32009:
            self.fail(base, "post", r.status_code, f"no VersionNotSupported: {r.data[:200]!r}")
        self.call("traffic", "POST", base, 200, headers=v, body="not json", request="invalid", refusal=True,
                  note="parse error")

        rest = f"{base}/v1"
        r = self.call("traffic", "POST", f"{rest}/message:send", 200, headers=v, body=json.dumps(message("m-3")))
        task2 = (r.json().get("task") or {}).get("id", "none") if r.status_code == 200 else "none"
        self.call("traffic", "POST", f"{rest}/message:send", 400, headers=v, body="not json", request="invalid")
        self.call("traffic", "POST", f"{rest}/message:stream", 200, headers=v, body=json.dumps(message("m-4", False)),
                  **SSE)
        self.call("traffic", "POST", f"{rest}/message:stream", 400, headers=v,
                  body=json.dumps({"message": {"messageId": "m-5", "role": "ROLE_USER", "parts": []}}),
                  request="invalid", note="no parts")
        self.call("traffic", "POST", f"/a2a/{self.name('nobody')}/v1/message:send", 503, headers=v,
                  body=json.dumps(message("m-6")), note="an agent not registered")
        r = self.call("traffic", "POST", f"/a2a/{self.name('nobody')}", 200, headers=v,
                      body=rpc(9, "SendMessage", message("m-7")), refusal=True, note="an agent not registered")
        if not rpc_error(r):
            self.fail(base, "post", r.status_code, f"no JSON-RPC error for an agent not registered: {r.data[:200]!r}")
        self.call("traffic", "GET", f"{rest}/tasks?pageSize=10", 200, headers=v)
        self.call("traffic", "GET", f"{rest}/tasks?pageSize=0", 400, headers=v, request="invalid")
        self.call("traffic", "GET", f"{rest}/tasks/{task}", 200, headers=v)
        self.call("traffic", "GET", f"{rest}/tasks/nope", 404, headers=v)
        self.call("traffic", "GET", f"{rest}/tasks/{task}:subscribe", 200, headers=v, **SSE)
        self.call("traffic", "GET", f"{rest}/tasks/nope:subscribe", 404, headers=v)
        self.call("traffic", "POST", f"{rest}/tasks/{task2}:subscribe", 200, headers=v, **SSE)
        self.call("traffic", "POST", f"{rest}/tasks/{task}:cancel", 200, headers=v)
        self.call("traffic", "POST", f"{rest}/tasks/{task}:cancel", 400, headers=v, request="any",
                  note="a canceled task")
        self.call("traffic", "POST", f"{rest}/tasks/{task}:subscribe", 400, headers=v, request="any",
                  note="a task in a terminal state")
        self.call("traffic", "POST", base, 200, headers=v, body=rpc(8, "CancelTask", {"id": task2}))
        # The agent leaves.
        if self.agent_sock:
            self.agent_sock.close()

    def classic(self):
        client = [("idc", "idc"), ("sys", "1234"), ("pid", "4242"), ("protocoltype", "eventmeshmessage")]
        form = [("content-type", "application/x-www-form-urlencoded")]
        topic = self.name("classic")
        send = f"topic={topic}&content=%7B%22sku%22%3A%22C-3%22%7D&bizseqno=764553018247542903411&uniqueid=u-1" \
               f"&producergroup=ignored&ttl=3000"

        def ok(r, want=0):
            try:
                return r.json()["retCode"] == want
            except Exception:  # noqa: BLE001
                return False

        for path in ("/", "/eventmesh/publish"):
            code = [("code", "104")] if path == "/" else []
            r = self.call("traffic", "POST", path, 200, headers=code + client + form, body=send)
            if not ok(r):
                self.fail(path, "post", 200, f"not retCode 0: {r.data[:200]!r}")
            r = self.call("traffic", "POST", path, 200, headers=code + form, body=send, request="invalid", refusal=True,
                          note="no client headers")
            if not ok(r, 6):
                self.fail(path, "post", 200, f"not retCode 6: {r.data[:200]!r}")
        json_ct = [("content-type", "application/json")]
        r = self.call("traffic", "POST", "/eventmesh/publish", 200, headers=client + json_ct,
                      body=json.dumps({"topic": topic, "content": "json", "bizseqno": "1", "uniqueid": "u-2",
                                       "producergroup": "g"}), note="a JSON object of the fields")
        if not ok(r):
            self.fail("/eventmesh/publish", "post", 200, f"not retCode 0: {r.data[:200]!r}")
        self.call("traffic", "POST", "/", 200, headers=[("code", "203")] + client + form, body="x=1", note="heartbeat")
        self.call("traffic", "POST", "/", 400, headers=[("code", "999")] + client + form, body="x=1",
                  request="invalid", note="unknown code")
        batch = f"batchId=b-1&producerGroup=g&contents=" + quote(json.dumps(
            [{"bizSeqNo": "11", "topic": topic, "msg": "hi"}, {"bizSeqNo": "12", "topic": topic, "msg": "there"}]))
        r = self.call("traffic", "POST", "/eventmesh/publish/batch", 200, headers=client + form, body=batch)
        if not ok(r):
            self.fail("/eventmesh/publish/batch", "post", 200, f"not retCode 0: {r.data[:200]!r}")
        r = self.call("traffic", "POST", "/eventmesh/publish/batch", 200, headers=client + form, body="batchId=b-2",
                      refusal=True, note="no contents")
        if ok(r):
            self.fail("/eventmesh/publish/batch", "post", 200, "a batch without contents was taken")
        local = {"url": "http://127.0.0.1:9/push", "consumerGroup": self.name("cg"),
                 "topic": [{"topic": topic, "mode": "CLUSTERING", "type": "ASYNC"}]}
        r = self.call("traffic", "POST", "/eventmesh/subscribe/local", 200, headers=json_ct, body=json.dumps(local))
        if not ok(r):
            self.fail("/eventmesh/subscribe/local", "post", 200, f"not retCode 0: {r.data[:200]!r}")
        r = self.call("traffic", "POST", "/eventmesh/subscribe/local", 200, headers=json_ct,
                      body=json.dumps({"consumerGroup": "g", "topic": [{"topic": topic}]}), request="invalid",
                      refusal=True, note="no url")
        if ok(r):
            self.fail("/eventmesh/subscribe/local", "post", 200, "a subscription without url was taken")
        r = self.call("traffic", "POST", "/eventmesh/unsubscribe/local", 200, headers=json_ct,
                      body=json.dumps(dict(local, topic=[topic])))
        if not ok(r):
            self.fail("/eventmesh/unsubscribe/local", "post", 200, f"not retCode 0: {r.data[:200]!r}")
        r = self.call("traffic", "POST", "/eventmesh/unsubscribe/local", 200, headers=json_ct,
                      body=json.dumps({"consumerGroup": "g"}), request="invalid", refusal=True, note="no url")
        if ok(r):
            self.fail("/eventmesh/unsubscribe/local", "post", 200, "an unsubscription without url was taken")

    def admin_storage(self):
        t = self.name("explicit")
        self.call("admin", "PUT", f"/admin/topics/{t}", 201, body={"partitions": 3, "retention_ms": 86400000})
        self.call("admin", "PUT", f"/admin/topics/{t}", 200, body={"partitions": 3, "retention_ms": 86400000},
                  note="the same settings")
        self.call("admin", "PUT", f"/admin/topics/{t}", 409, body={"partitions": 4}, note="other settings")
        self.call("admin", "PUT", f"/admin/topics/{self.name('zero')}", 400, body={"partitions": 0}, request="invalid")
        self.call("admin", "PUT", f"/admin/topics/{self.name('x')}", 400, body={"parts": 1}, request="invalid")
        self.call("admin", "PUT", "/admin/topics/session.x", 400, body={"partitions": 1}, request="any",
                  note="a lite topic")
        self.call("admin", "GET", "/admin/topics", 200)
        self.call("admin", "GET", f"/admin/topics/{self.topic}/partitions/0/events?from=0&max=10", 200)
        self.call("admin", "GET", f"/admin/topics/session.chat-{self.run_id}/partitions/0/events", 200,
                  note="a lite topic")
        self.call("admin", "GET", f"/admin/topics/{self.topic}/partitions/9/events", 404, note="no such partition")
        self.call("admin", "GET", f"/admin/topics/{self.name('nope')}/partitions/0/events", 404)
        self.call("admin", "GET", f"/admin/topics/{self.topic}/partitions/0/events?from=x", 400, request="invalid")
        self.call("admin", "GET", "/admin/subscriptions", 200)
        self.call("admin", "GET", "/admin/cluster", 200)
        self.call("admin", "GET", "/admin/agents", 200)

        # A dead letter (maxAttempts 1, nacked), listed, then replayed.
        topic, sub = self.name("dl"), self.name("dl-sub")
        self.call("traffic", "POST", "/events/subscribe", 201,
                  body={"subscription": sub, "topic": topic, "start": "earliest", "maxAttempts": 1})
        self.call("traffic", "POST", f"/events/publish?topic={topic}", 202,
                  headers=[("content-type", "application/cloudevents+json")],
                  body=json.dumps({"specversion": "1.0", "id": "d-1", "source": "/oa", "type": "t"}))
        r = self.call("traffic", "GET", f"/events/poll?subscription={sub}&max=1&waitMs=3000", 200)
        ids = [e["emdeliveryid"] for e in r.json()] if r.status_code == 200 else []
        self.call("traffic", "POST", "/events/ack", 200, body={"subscription": sub, "ids": ids, "nack": True})
        letters = []
        for _ in range(50):
            r = self.call("admin", "GET", f"/admin/dlq/{topic}", 200)
            letters = r.json() if r.status_code == 200 else []
            if letters:
                break
            time.sleep(0.1)
        if not letters:
            self.fail("/admin/dlq/{topic}", "get", 200, "the nacked event was not dead-lettered")
        self.call("admin", "GET", f"/admin/dlq/{topic}?max=1000", 200)
        self.call("admin", "GET", f"/admin/dlq/{topic}?max=0", 400, request="invalid")
        self.call("admin", "GET", f"/admin/dlq/{self.name('nope')}", 404)
        r = self.call("admin", "POST", f"/admin/dlq/{topic}/replay", 200)
        if r.status_code == 200 and r.json().get("replayed") != len(letters):
            self.fail("/admin/dlq/{topic}/replay", "post", 200, f"replayed {r.json()}, listed {len(letters)}")
        self.call("admin", "POST", f"/admin/dlq/{self.name('nope')}/replay", 404)

    def admin_governance(self):
        rid = self.name("rule")
        rule = {"principal": "svc-*", "resource": "topic:orders.*", "actions": ["PUBLISH"], "effect": "ALLOW",
                "priority": 10}
        self.call("admin", "PUT", f"/admin/acl/{rid}", 201, body=rule)
        self.call("admin", "PUT", f"/admin/acl/{rid}", 200, body=dict(rule, priority=11), note="replaced")
        self.call("admin", "PUT", f"/admin/acl/{rid}", 400, body=dict(rule, effect="MAYBE"), request="invalid")
        self.call("admin", "PUT", f"/admin/acl/{rid}", 400, body=dict(rule, resource="queue:x"), request="invalid")
        self.call("admin", "PUT", "/admin/acl/bad%20id", 400, body=rule, request="any", note="a bad id")
        self.call("admin", "GET", "/admin/acl", 200)
        self.call("admin", "GET", f"/admin/acl/{rid}", 200)
        self.call("admin", "DELETE", f"/admin/acl/{rid}", 200)
        self.call("admin", "GET", f"/admin/acl/{rid}", 404)
        self.call("admin", "DELETE", f"/admin/acl/{rid}", 404)

        lid = self.name("lim")
        limit = {"scope": f"topic:{self.name('nothing')}", "eventsPerSecond": 1000, "bytesPerSecond": 1048576,
                 "burst": 2000}
        self.call("admin", "PUT", f"/admin/limits/{lid}", 201, body=limit)
        self.call("admin", "PUT", f"/admin/limits/{lid}", 200, body=dict(limit, burst=3000), note="replaced")
        self.call("admin", "PUT", f"/admin/limits/{lid}", 400, body={"scope": "planet:x", "eventsPerSecond": 1},
                  request="invalid")
        self.call("admin", "PUT", f"/admin/limits/{lid}", 400, body={"scope": "topic:x"}, request="any",
                  note="no rate")
        self.call("admin", "GET", "/admin/limits", 200)
        self.call("admin", "GET", f"/admin/limits/{lid}", 200)
        self.call("admin", "DELETE", f"/admin/limits/{lid}", 200)
        self.call("admin", "DELETE", f"/admin/limits/{lid}", 404)
        self.call("admin", "GET", f"/admin/limits/{lid}", 404)

        tenant = f"t{self.run_id}"
        quota = {"connections": 100, "topics": 10, "subscriptions": 20, "backlogBytes": 1048576}
        self.call("admin", "PUT", f"/admin/quotas/{tenant}", 201, body=quota)
        self.call("admin", "PUT", f"/admin/quotas/{tenant}", 200, body=dict(quota, topics=11), note="replaced")
        self.call("admin", "PUT", "/admin/quotas/session", 400, body=quota, request="any", note="a reserved name")
        self.call("admin", "PUT", f"/admin/quotas/{tenant}", 400, body={"topics": -1}, request="invalid")
        self.call("admin", "GET", "/admin/quotas", 200)
        self.call("admin", "GET", f"/admin/quotas/{tenant}", 200)
        self.call("admin", "DELETE", f"/admin/quotas/{tenant}", 200)
        self.call("admin", "DELETE", f"/admin/quotas/{tenant}", 404)
        self.call("admin", "GET", f"/admin/quotas/{tenant}", 404)

        tt = self.name("shaped")
        transformer = {"rename": {"subject": "orderref"}, "remove": ["legacy"], "set": {"type": "com.oa.v2"},
                       "variables": {"id": "$.data.order.id"}, "data": {"orderId": "${id}"}}
        self.call("admin", "PUT", f"/admin/transformers/{tt}", 201, body=transformer)
        self.call("admin", "PUT", f"/admin/transformers/{tt}", 200, body={"set": {"vip": True}}, note="replaced")
        self.call("admin", "PUT", f"/admin/transformers/{tt}", 400, body={"remove": ["id"]}, request="any",
                  note="removing id")
        self.call("admin", "PUT", f"/admin/transformers/{tt}", 400, body={"colour": "red"}, request="invalid")
        self.call("admin", "PUT", "/admin/transformers/session.x", 400, body={"set": {"a": "b"}}, request="any",
                  note="a lite topic")
        self.call("traffic", "POST", f"/events/publish?topic={tt}", 202,
                  headers=[("content-type", "application/cloudevents+json")],
                  body=json.dumps({"specversion": "1.0", "id": "s-1", "source": "/oa", "type": "t"}),
                  note="through the transformer")
        self.call("admin", "GET", "/admin/transformers", 200)
        self.call("admin", "GET", f"/admin/transformers/{tt}", 200)
        self.call("admin", "DELETE", f"/admin/transformers/{tt}", 200)
        self.call("admin", "DELETE", f"/admin/transformers/{tt}", 404)
        self.call("admin", "GET", f"/admin/transformers/{tt}", 404)

        route_id = self.name("route")
        src, dst = self.name("src"), self.name("dst")
        route = {"topic": src, "condition": "type = 'com.oa.moved'", "targets": [dst], "mode": "move"}
        self.call("admin", "PUT", f"/admin/routes/{route_id}", 201, body=route)
        self.call("admin", "PUT", f"/admin/routes/{route_id}", 200, body=dict(route, mode="copy"), note="replaced")
        self.call("admin", "PUT", f"/admin/routes/{route_id}", 400, body=dict(route, targets=[src]), request="any",
                  note="targets itself")
        self.call("admin", "PUT", f"/admin/routes/{route_id}", 400, body=dict(route, condition="type ="),
                  request="any", note="CESQL that does not parse")
        self.call("admin", "PUT", f"/admin/routes/{route_id}", 400, body=dict(route, mode="teleport"),
                  request="invalid")
        self.call("admin", "PUT", f"/admin/routes/{route_id}", 200, body=route, note="move again")
        r = self.call("traffic", "POST", f"/events/publish?topic={src}", 202,
                      headers=[("content-type", "application/cloudevents+json")],
                      body=json.dumps({"specversion": "1.0", "id": "r-1", "source": "/oa", "type": "com.oa.moved"}),
                      note="moved by a route")
        if r.status_code == 202 and r.json().get("topic") != dst:
            self.fail("/events/publish", "post", 202, f"a moved event's answer names {r.json()}")
        self.call("admin", "GET", "/admin/routes", 200)
        self.call("admin", "GET", f"/admin/routes/{route_id}", 200)
        self.call("admin", "DELETE", f"/admin/routes/{route_id}", 200)
        self.call("admin", "DELETE", f"/admin/routes/{route_id}", 404)
        self.call("admin", "GET", f"/admin/routes/{route_id}", 404)

    def wrong_methods(self):
        """Every path, with a method it does not document: 405 + Allow naming exactly the
        documented methods (traffic), 404 (admin); problems either way."""
        samples = {"sid": f"{self.agent}:00000000-0000-4000-8000-000000000000", "agentId": self.agent,
                   "id": "x1", "topic": self.topic, "partition": "0", "tenant": "t-1"}
        problem_schema = self.doc["components"]["schemas"]["Problem"]
        for path, item in self.doc["paths"].items():
            documented = {m for m in METHODS if m in item}
            wrong = next(m for m in ("delete", "put", "post", "get") if m not in documented)
            target = path
            for k, v in samples.items():
                target = target.replace("{" + k + "}", v)
            if path.startswith("/session/subscribe") or path.startswith("/session/publish"):
                target = target.replace(samples["sid"], "chat-1")
            listener = "admin" if any(s["url"].endswith(":8081") for s in item.get("servers", [])) else "traffic"
            headers = [("A2A-Version", "1.0")] if path.startswith("/a2a/") else []
            if path == "/":
                headers = [("code", "104")]
            _, r = self.send(listener, wrong.upper(), target, headers, b"")
            label = f"{wrong.upper()} (not documented)"
            if path in METHOD_CONTRADICTIONS:
                if r.status_code != 405:
                    self.fail(path, label, r.status_code, "expected 405")
                elif r.content_type.startswith("application/problem+json"):
                    self.fail(path, label, 405, "listed in METHOD_CONTRADICTIONS but now a problem: take it out")
                else:
                    why = METHOD_CONTRADICTIONS[path]
                    self.notes.append(f"SPEC contradiction: {path} {wrong.upper()} -> 405: {why}")
                continue
            if path.startswith("/a2a/") and "/v1/" in path:
                # The REST binding answers a route it does not have as the A2A specification says.
                if r.status_code != 404 or not r.content_type.startswith("application/json") \
                        or "error" not in r.json():
                    self.fail(path, label, r.status_code, f"expected an A2A 404 error: {r.data[:200]!r}")
                continue
            want = 404 if listener == "admin" else 405
            if r.status_code != want:
                self.fail(path, label, r.status_code, f"expected {want}: {r.data[:200]!r}")
                continue
            if not r.content_type.startswith("application/problem+json"):
                self.fail(path, label, r.status_code, f"not a problem: {r.content_type}")
                continue
            body = r.json()
            missing = [k for k in problem_schema["required"] if k not in body]
            if missing or body.get("status") != want:
                self.fail(path, label, r.status_code, f"not a Problem: {body}")
            if want == 405:
                allow = {m.strip().lower() for m in (r.header("allow") or "").split(",") if m.strip()}
                if allow != documented:
                    self.fail(path, label, 405, f"Allow: {r.header('allow')!r}, documented {sorted(documented)}")

    def coverage(self):
        for key in self.operations():
            if key in NOT_DRIVEN:
                continue
            counts = self.driven.get(key)
            if counts is None:
                self.fail(key[0], key[1], "-", "documented but never driven (drive it, or list it in NOT_DRIVEN)")
                continue
            if counts["ok"] == 0 and key not in NO_SUCCESS:
                self.fail(key[0], key[1], "-", "driven, but never to a good answer")
            if counts["refusal"] == 0 and key not in NO_REFUSAL:
                self.fail(key[0], key[1], "-", "driven, but never refused (drive a refusal, or list it in NO_REFUSAL)")
        for key in self.driven:
            if key not in set(self.operations()):
                self.fail(key[0], key[1], "-", "driven but not in the document")
        for key in SPEC_CONTRADICTIONS:
            if key not in self.contradictions_seen:
                self.fail(key[0], key[1], key[2], "a listed SPEC contradiction was not met: drive it or take it out")
        for key in list(NOT_DRIVEN) + list(NO_REFUSAL) + list(NO_SUCCESS):
            if key not in set(self.operations()):
                self.fail(key[0], key[1], "-", "listed but not in the document")


def quote(s):
    from urllib.parse import quote as q
    return q(s, safe="")


def main():
    if len(sys.argv) != 5 or sys.argv[1] != "run":
        sys.exit(__doc__)
    c = Checker(sys.argv[2], sys.argv[3], sys.argv[4])
    try:
        c.run()
    except Exception as e:  # noqa: BLE001 - report what was found so far, then fail
        import traceback
        traceback.print_exc()
        c.failures.append(f"the drive stopped: {type(e).__name__}: {e}")
    ops = list(c.operations())
    print(f"document: {len(c.doc['paths'])} paths, {len(ops)} operations; driven {len(c.driven)} "
          f"({sum(v['ok'] + v['refusal'] for v in c.driven.values())} validated exchanges)")
    for key, why in sorted(NOT_DRIVEN.items()):
        print(f"not driven: {key[0]} {key[1].upper()}: {why}")
    for n in sorted(set(c.notes)):
        print(f"note: {n}")
    if c.failures:
        print(f"{len(c.failures)} mismatches:")
        for f in c.failures:
            print(f"  {f}")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
