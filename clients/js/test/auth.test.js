// Credentials against a real broker with auth = "jwt": the token as a bearer header on HTTP
// (SSE too) and as ?access_token= on WebSockets, a 401 answered by refreshing the token once,
// a WebSocket closed with 1008 "token expired" reattached at once with a fresh token, and a
// token nobody can refresh refused for good.
import assert from 'node:assert/strict';
import { createHmac, randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { Client, EvmeshError } from '../dist/index.js';
import { WebSocketImpl, event, startBroker, stateReached } from '../test-support/broker.js';

const SECRET = randomBytes(32);
const b64url = (b) => Buffer.from(b).toString('base64url');

/** An HS256 JWT for `sub` valid `lifetimeS` seconds. */
function jwt(sub, lifetimeS) {
  const exp = Math.floor(Date.now() / 1000) + lifetimeS;
  const head = b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT', kid: 'k1' }));
  const body = b64url(JSON.stringify({ sub, exp }));
  const sig = createHmac('sha256', SECRET).update(`${head}.${body}`).digest('base64url');
  return { value: `${head}.${body}.${sig}`, expiresAt: new Date(exp * 1000) };
}

let broker;
let dir;
before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'evmesh-js-auth-'));
  await writeFile(join(dir, 'jwks.json'), JSON.stringify({ keys: [{ kty: 'oct', kid: 'k1', alg: 'HS256', k: b64url(SECRET) }] }));
  const rule = (id, resource) =>
    `[[acl]]\nid = "${id}"\nprincipal = "*"\nresource = "${resource}"\nactions = ["PUBLISH", "SUBSCRIBE", "REQUEST", "REPLY"]\neffect = "ALLOW"\npriority = 1\n`;
  await writeFile(
    join(dir, 'evmesh.toml'),
    `auth = "jwt"\njwt_jwks_file = "${join(dir, 'jwks.json')}"\n${rule('topics', 'topic:*')}${rule('subs', 'subscription:*')}`,
  );
  broker = await startBroker({ args: ['--config', join(dir, 'evmesh.toml')] });
});
after(async () => {
  await broker?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

test('no token is a 401 problem; a refused token is refreshed once and the call goes through', async () => {
  await assert.rejects(new Client(broker.url).publish('a', event('x')), (e) => e instanceof EvmeshError && e.status === 401);
  let calls = 0;
  // The first token the callback hands out has already expired: the broker refuses it.
  const client = new Client(broker.url, { refreshLeadMs: -60_000, tokenRefresh: async () => (calls++ === 0 ? jwt('alice', -30) : jwt('alice', 3600)) });
  assert.ok(Number.isInteger((await client.publish('a', event('y'))).offset));
  assert.equal(calls, 2);
});

test('websocket (?access_token=) and sse (Authorization) consumers attach with the token; a bad one is refused for good', async () => {
  const client = new Client(broker.url, { WebSocket: WebSocketImpl, tokenRefresh: async () => jwt('alice', 3600) });
  await client.subscribe({ subscription: 'auth-ws', topic: 'auth', start: 'earliest' });
  await client.subscribe({ subscription: 'auth-sse', topic: 'auth', start: 'earliest' });
  await client.publish('auth', event('secret-1'));
  for (const [name, transport] of [
    ['auth-ws', 'websocket'],
    ['auth-sse', 'sse'],
  ]) {
    const consumer = client.consumer(name, { transport });
    const d = await consumer.nextDelivery();
    assert.equal(d.event.id, 'secret-1');
    d.ack();
    await consumer.close();
  }
  const bad = new Client(broker.url, { WebSocket: WebSocketImpl, token: 'not-a-jwt' }).consumer('auth-ws');
  await assert.rejects(bad.nextDelivery(), (e) => e instanceof EvmeshError && e.status === 401);
  assert.equal(bad.state.kind, 'closed');
});

test('a WebSocket closed with 1008 "token expired" is reattached at once with a fresh token', async () => {
  let issued = 0;
  const client = new Client(broker.url, {
    WebSocket: WebSocketImpl,
    refreshLeadMs: 0,
    backoff: { minMs: 50, maxMs: 500 },
    tokenRefresh: async () => {
      issued += 1;
      return jwt('alice', issued === 1 ? 2 : 3600);
    },
  });
  await client.subscribe({ subscription: 'auth-expiry', topic: 'auth-expiry', start: 'earliest' });
  const consumer = client.consumer('auth-expiry');
  const states = [];
  consumer.onState((s) => states.push(s));
  await stateReached(consumer, 'connected');
  const expired = new Promise((resolve) => {
    const off = consumer.onState((s) => {
      if (s.kind === 'disconnected' && /1008 token expired/.test(s.reason)) {
        off();
        resolve(s);
      }
    });
  });
  const gone = await expired;
  assert.equal(gone.retryInMs, 0, 'reattached at once');
  await stateReached(consumer, 'connected');
  await client.publish('auth-expiry', event('after-expiry'));
  const d = await consumer.nextDelivery();
  assert.equal(d.event.id, 'after-expiry');
  d.ack();
  await consumer.close();
  assert.ok(issued >= 2);
  assert.ok(states.filter((s) => s.kind === 'connected').length >= 2);
});
