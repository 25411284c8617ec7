"""Interop: JSON Web Tokens minted by PyJWT (HS256, RS256, ES256, EdDSA), with the JWKS written by
PyJWT too, against an evmesh with auth = jwt. Checks every 401 path (expired, not yet valid, wrong
audience, wrong issuer, wrong key, unknown kid, alg none, HS256 with the RSA public key as
secret), 403 from the ACL, the admin API with an ADMIN principal, ?access_token= on WebSocket and
SSE with the session closed (1008 "token expired") when the token expires, and key rotation by
rewriting the JWKS file while the broker runs.

usage: python_jwt.py keys DIR                       (writes DIR/jwks.json and the private keys)
       python_jwt.py run DIR TRAFFIC ADMIN           (exit 0 = every check passed)
"""
import json
import os
import sys
import time

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, HMACAlgorithm, OKPAlgorithm, RSAAlgorithm

AUD, ISS = "evmesh", "https://issuer.test"
HS_SECRET = b"an-hs256-secret-of-at-least-32-bytes!"


def pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def jwk(alg_cls, key, kid, alg):
    d = json.loads(alg_cls.to_jwk(key))
    d.update({"kid": kid, "alg": alg})
    return d


def write_jwks(path, keys):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"keys": keys}, f)
    os.replace(tmp, path)  # atomic: the broker never reads half a file


def make_keys(d):
    rs, rs2, rs_other = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(3))
    es = ec.generate_private_key(ec.SECP256R1())
    ed = ed25519.Ed25519PrivateKey.generate()
    for name, key in [("rs", rs), ("rs2", rs2), ("rs_other", rs_other), ("es", es), ("ed", ed)]:
        with open(f"{d}/{name}.pem", "wb") as f:
            f.write(pem(key))
    write_jwks(f"{d}/jwks.json", [
        jwk(HMACAlgorithm, HS_SECRET, "hs1", "HS256"),
        jwk(RSAAlgorithm, rs.public_key(), "rs1", "RS256"),
        jwk(ECAlgorithm, es.public_key(), "es1", "ES256"),
        jwk(OKPAlgorithm, ed.public_key(), "ed1", "EdDSA"),
    ])


def load(d, name):
    with open(f"{d}/{name}.pem", "rb") as f:
        return serialization.load_pem_private_key(f.read(), password=None)


def run(d, traffic, admin):
    keys = {"hs1": (HS_SECRET, "HS256"), "rs1": (load(d, "rs"), "RS256"), "es1": (load(d, "es"), "ES256"),
            "ed1": (load(d, "ed"), "EdDSA")}
    now = int(time.time())

    def token(kid="rs1", sub="svc-a", key=None, alg=None, **claims):
        k, a = keys.get(kid, (None, None))
        payload = {"sub": sub, "aud": AUD, "iss": ISS, "iat": now, "exp": now + 300}
        payload.update(claims)
        payload = {k2: v for k2, v in payload.items() if v is not None}
        return jwt.encode(payload, key if key is not None else k, algorithm=alg or a, headers={"kid": kid})

    http = httpx.Client(base_url=f"http://{traffic}", timeout=20)
    event = {"specversion": "1.0", "id": "1", "source": "/jwt", "type": "t", "data": {"n": 1}}

    def publish(tok, topic="orders.x", client=http):
        h = {"content-type": "application/cloudevents+json"}
        if tok is not None:
            h["authorization"] = f"Bearer {tok}"
        return client.post(f"/events/publish?topic={topic}", headers=h, content=json.dumps(event))

    # Every algorithm, each key chosen by its kid.
    for kid in ["hs1", "rs1", "es1", "ed1"]:
        r = publish(token(kid))
        assert r.status_code == 202, (kid, r.status_code, r.text)

    def refused(tok, why):
        r = publish(tok)
        assert r.status_code == 401, (why, r.status_code, r.text)
        assert r.headers["content-type"] == "application/problem+json", r.headers
        assert r.headers["www-authenticate"].startswith("Bearer"), r.headers
        assert why in r.json()["detail"], (why, r.json())

    refused(None, "credentials required")
    refused(token(exp=now - 60), "expired")
    refused(token(nbf=now + 300), "not valid yet")
    refused(token(aud="someone-else"), "audience")
    refused(token(aud=None), "audience")
    refused(token(iss="https://evil.test"), "issuer")
    refused(token(key=load(d, "rs_other")), "signature")
    refused(token(kid="nope", key=load(d, "rs_other"), alg="RS256"), "no key")
    refused(jwt.encode({"sub": "svc-a", "aud": AUD, "iss": ISS}, None, algorithm="none"), "malformed")
    rs_public_pem = load(d, "rs").public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    # The classic confusion: HS256 keyed with the RSA public key, under the RSA key's kid.
    try:
        confused = jwt.encode({"sub": "svc-a", "aud": AUD, "iss": ISS, "exp": now + 300}, rs_public_pem,
                              algorithm="HS256", headers={"kid": "rs1"})
    except jwt.exceptions.InvalidKeyError:
        confused = None  # newer PyJWT refuses to build it at all; nothing to send then
    if confused is not None:
        refused(confused, "no key")

    # The ACL: svc-* may publish orders.*; others may not (403, not 401).
    r = publish(token(sub="intruder"))
    assert r.status_code == 403, (r.status_code, r.text)
    r = publish(token(), topic="payments")
    assert r.status_code == 403, (r.status_code, r.text)

    # The admin API: an ADMIN principal, and a principal without ADMIN.
    adm = httpx.Client(base_url=f"http://{admin}", timeout=20)
    r = adm.get("/admin/acl", headers={"authorization": f"Bearer {token(sub='ops')}"})
    assert r.status_code == 200, r.text
    r = adm.get("/admin/acl", headers={"authorization": f"Bearer {token()}"})
    assert r.status_code == 403, r.text

    # Sessions from browsers: ?access_token=, closed when the token expires.
    sub = {"subscription": "jwt-live", "topic": "orders.x", "mode": "BROADCAST"}
    r = http.post("/events/subscribe", json=sub, headers={"authorization": f"Bearer {token()}"})
    assert r.status_code == 201, r.text
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect
    short = token(exp=int(time.time()) + 2)
    started = time.time()
    with connect(f"ws://{traffic}/events/ws?subscription=jwt-live&ack=none&access_token={short}") as ws:
        try:
            while True:
                ws.recv(timeout=10)
        except ConnectionClosed as e:
            assert e.rcvd is not None and e.rcvd.code == 1008, e
            assert e.rcvd.reason == "token expired", e.rcvd
    assert time.time() - started < 8, time.time() - started
    try:
        connect(f"ws://{traffic}/events/ws?subscription=jwt-live&ack=none&access_token=garbage")
        raise AssertionError("attached with a bad token")
    except Exception as e:  # websockets.exceptions.InvalidStatus
        assert "401" in str(e), e
    short = token(exp=int(time.time()) + 2)
    with http.stream("GET", f"/events/sse?subscription=jwt-live&access_token={short}") as r:
        assert r.status_code == 200, r.status_code
        started = time.time()
        for _ in r.iter_bytes():
            pass  # keep-alive comments until the stream ends
    assert time.time() - started < 8, time.time() - started

    # Rotation: rs1 is replaced by rs2 in the file; a keep-alive connection that was verified with
    # rs1 is refused on its next request, and rs2 works, without a restart.
    keep = httpx.Client(base_url=f"http://{traffic}", timeout=20)
    old = token("rs1")
    assert publish(old, client=keep).status_code == 202
    rs2 = load(d, "rs2")
    write_jwks(f"{d}/jwks.json", [jwk(RSAAlgorithm, rs2.public_key(), "rs2", "RS256")])
    keys["rs2"] = (rs2, "RS256")
    deadline = time.time() + 10
    while publish(token("rs2")).status_code != 202:
        assert time.time() < deadline, "the rotated JWKS was not picked up"
        time.sleep(0.05)
    r = publish(old, client=keep)
    assert r.status_code == 401 and "no key" in r.json()["detail"], (r.status_code, r.text)
    print("all checks passed")


if __name__ == "__main__":
    if sys.argv[1] == "keys":
        make_keys(sys.argv[2])
    else:
        run(sys.argv[2], sys.argv[3], sys.argv[4])
