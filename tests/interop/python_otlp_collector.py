"""An OTLP/HTTP trace collector for the tests: takes POST /v1/traces in protobuf (decoded with
the official opentelemetry-proto messages) or JSON (OTLP's JSON mapping, read by hand: ids are
hex there, which protobuf's own JSON reader does not take), and appends every span to a file as
one JSON line: trace, span and parent ids in hex, name, kind, attributes, status, the
resource's service.name and the content type it came in. Prints its port, then serves until
killed.

usage: python_otlp_collector.py OUT_FILE
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def from_proto(body):
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    for rs in req.resource_spans:
        res = {a.key: any_value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent": s.parent_span_id.hex() or None,
                    "name": s.name,
                    "kind": s.kind,
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                    "attrs": {a.key: any_value(a.value) for a in s.attributes},
                    "status": s.status.code,
                    "service": res.get("service.name"),
                    "instance": res.get("service.instance.id"),
                }


def json_value(v):
    for k in ("stringValue", "boolValue", "doubleValue"):
        if k in v:
            return v[k]
    if "intValue" in v:
        return int(v["intValue"])
    return None


def from_json(body):
    req = json.loads(body)
    for rs in req["resourceSpans"]:
        res = {a["key"]: json_value(a["value"]) for a in rs["resource"]["attributes"]}
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                yield {
                    "trace_id": s["traceId"],
                    "span_id": s["spanId"],
                    "parent": s.get("parentSpanId") or None,
                    "name": s["name"],
                    "kind": s["kind"],
                    "start": int(s["startTimeUnixNano"]),
                    "end": int(s["endTimeUnixNano"]),
                    "attrs": {a["key"]: json_value(a["value"]) for a in s.get("attributes", [])},
                    "status": s.get("status", {}).get("code", 0),
                    "service": res.get("service.name"),
                    "instance": res.get("service.instance.id"),
                }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        ctype = self.headers.get("content-type", "")
        try:
            if self.path != "/v1/traces":
                raise ValueError(f"path {self.path}")
            spans = list(from_json(body) if ctype.startswith("application/json") else from_proto(body))
        except Exception as e:  # a malformed export is the broker's bug: say so loudly
            msg = f"bad export ({ctype}): {e}".encode()
            self.send_response(400)
            self.send_header("content-length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            with open(OUT + ".errors", "a") as f:
                f.write(msg.decode() + "\n")
            return
        with open(OUT, "a") as f:
            for s in spans:
                s["content_type"] = ctype
                f.write(json.dumps(s) + "\n")
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
