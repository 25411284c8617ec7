"""A publisher traced with the official OpenTelemetry SDK: a PRODUCER span around an HTTP
publish of a CloudEvent, its context injected into the request's headers by the SDK's W3C
propagator (the event itself carries none), the span exported to the collector over OTLP/HTTP.
Prints {"trace_id", "span_id", "event_id"} as JSON.

usage: python_otel_publish.py BROKER_URL COLLECTOR_URL TOPIC EVENT_ID
"""
import json
import sys

import httpx
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

broker, collector, topic, event_id = sys.argv[1:5]
provider = TracerProvider(resource=Resource.create({"service.name": "publisher"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector}/v1/traces")))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("evmesh-test")

with tracer.start_as_current_span(f"send {topic}", kind=trace.SpanKind.PRODUCER) as span:
    headers = {"content-type": "application/cloudevents+json"}
    inject(headers)
    event = {"specversion": "1.0", "id": event_id, "source": "/otel", "type": "com.example.traced", "data": {"n": 1}}
    r = httpx.post(f"{broker}/events/publish?topic={topic}", headers=headers, content=json.dumps(event))
    assert r.status_code == 202, (r.status_code, r.text)
    ctx = span.get_span_context()
provider.shutdown()
print(json.dumps({"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x"), "event_id": event_id}))
