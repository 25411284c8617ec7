"""Interop: TLS clients from Python's standard library (`ssl`, `http.client`) against evmesh.

Checks, on the TLS broker: ALPN selects http/1.1; TLS 1.3 and TLS 1.2 both complete; the
certificate verifies against the test CA for "localhost" and fails against another CA; keep-alive
publishing over one connection; the admin listener over TLS. On the mutual-TLS broker: a client
certificate of the CA publishes where the ACL lets its subject, and is refused elsewhere (403); no
certificate, no session.

usage: python_tls.py DIR TRAFFIC ADMIN MTLS_TRAFFIC   (exit 0 = every check passed)
DIR holds ca.pem, other-ca.pem, svc-ingest.pem and svc-ingest.key.
"""
import http.client
import json
import socket
import ssl
import sys

DIR, TRAFFIC, ADMIN, MTLS = sys.argv[1:5]


def hostport(a):
    h, p = a.rsplit(":", 1)
    return h, int(p)


def context(ca, cert=None, maximum=None):
    ctx = ssl.create_default_context(cafile=f"{DIR}/{ca}")
    ctx.set_alpn_protocols(["http/1.1"])
    if maximum is not None:
        ctx.maximum_version = maximum
    if cert is not None:
        ctx.load_cert_chain(f"{DIR}/{cert}.pem", f"{DIR}/{cert}.key")
    return ctx


def connection(addr, ctx):
    host, port = hostport(addr)
    # The certificate names localhost: connect to the address, verify the name.
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=20)
    conn.sock = ctx.wrap_socket(socket.create_connection((host, port), timeout=20), server_hostname="localhost")
    return conn


def event(i):
    return json.dumps({"specversion": "1.0", "id": f"py-{i}", "source": "/py", "type": "com.example.tls", "data": {"n": i}})


def publish(conn, topic, i):
    conn.request("POST", f"/events/publish?topic={topic}", body=event(i), headers={"content-type": "application/cloudevents+json"})
    r = conn.getresponse()
    return r.status, r.read()


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}")
        sys.exit(1)
    print(f"ok: {what}")


# ALPN, the protocol version, keep-alive publishing.
conn = connection(TRAFFIC, context("ca.pem"))
check(conn.sock.selected_alpn_protocol() == "http/1.1", "ALPN selects http/1.1")
check(conn.sock.version() == "TLSv1.3", f"TLS 1.3 by default ({conn.sock.version()})")
statuses = [publish(conn, "pytls", i)[0] for i in range(20)]
check(statuses == [202] * 20, f"20 publishes on one keep-alive TLS connection: {set(statuses)}")
conn.close()

conn12 = connection(TRAFFIC, context("ca.pem", maximum=ssl.TLSVersion.TLSv1_2))
check(conn12.sock.version() == "TLSv1.2", "a TLS 1.2 client is served")
check(publish(conn12, "pytls", 100)[0] == 202, "publish over TLS 1.2")
conn12.close()

# The admin listener.
admin = connection(ADMIN, context("ca.pem"))
admin.request("GET", "/healthz")
r = admin.getresponse()
check(r.status == 200 and json.loads(r.read())["status"] == "ok", "admin /healthz over TLS")
admin.close()

# A client that trusts another CA refuses the server.
try:
    connection(TRAFFIC, context("other-ca.pem"))
    check(False, "a client of another CA refuses the certificate")
except ssl.SSLCertVerificationError:
    check(True, "a client of another CA refuses the certificate")

# Mutual TLS: the certificate subject is the principal.
m = connection(MTLS, context("ca.pem", cert="svc-ingest"))
check(publish(m, "orders.py", 1)[0] == 202, "svc-ingest's certificate publishes to orders.py")
status, body = publish(m, "payments", 2)
check(status == 403 and b"svc-ingest" in body, f"and is refused on payments ({status})")
m.close()
try:
    bare = connection(MTLS, context("ca.pem"))
    status, _ = publish(bare, "orders.py", 3)
    check(False, f"a client without a certificate got {status}")
except (ssl.SSLError, ConnectionError, http.client.HTTPException, OSError) as e:
    check(True, f"a client without a certificate has no session ({type(e).__name__})")

print("all checks passed")
