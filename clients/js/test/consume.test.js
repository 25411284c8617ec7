// Consuming with acks over WebSocket, SSE and long-poll, refusals, and request-reply, against a
// real broker.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Client, EvmeshError } from '../dist/index.js';
import { WebSocketImpl, drained, event, startBroker, stateReached, until } from '../test-support/broker.js';

let broker;
let client;
before(async () => {
  broker = await startBroker();
  client = new Client(broker.url, { WebSocket: WebSocketImpl, backoff: { minMs: 50, maxMs: 500 } });
});
after(() => broker?.stop());

/**
 * Publishes `n` events to a new topic with a subscription from the earliest, consumes them over
 * `transport` acking each, and checks every event came exactly once.
 */
async function everyEventOnce(transport, n, options = {}) {
  const topic = `t-${transport}`;
  const name = `s-${transport}`;
  await client.subscribe({ subscription: name, topic, start: 'earliest' });
  const ids = Array.from({ length: n }, (_, i) => `${transport}-${i}`);
  // Half before the consumer attaches, half while it runs.
  await client.publishBatch(topic, ids.slice(0, n / 2).map((id) => event(id)));
  const consumer = client.consumer(name, { transport, ...options });
  const states = [];
  consumer.onState((s) => states.push(s.kind));
  const seen = [];
  const all = (async () => {
    for await (const d of consumer) {
      assert.equal(typeof d.id, 'string');
      assert.equal(d.event.emdeliveryid, d.id);
      assert.equal(typeof d.event.emoffset, 'string');
      assert.equal(d.attempt, 1);
      seen.push(d.event.id);
      d.ack();
      if (new Set(seen).size === n) return;
    }
  })();
  for (const id of ids.slice(n / 2)) await client.publish(topic, event(id));
  await all;
  // Every ack has reached the broker: nothing is left to deliver again.
  await until(() => drained(broker.admin, name), `${name} drained`);
  assert.equal(seen.length, n, 'no event twice');
  assert.deepEqual([...seen].sort(), [...ids].sort());
  assert.equal(consumer.state.kind, 'closed');
  assert.ok(states.includes('connected'));
}

test('websocket: every event once, with acks', () => everyEventOnce('websocket', 200, { window: 16 }));
test('sse: every event once, with acks', () => everyEventOnce('sse', 200, { window: 16 }));
test('longpoll: every event once, with acks', () => everyEventOnce('longpoll', 200, { window: 32, pollWaitMs: 1000 }));

test('a nacked delivery comes again with the next attempt', async () => {
  await client.subscribe({ subscription: 's-nack', topic: 't-nack', start: 'earliest' });
  await client.publish('t-nack', event('n-1'));
  const consumer = client.consumer('s-nack', { window: 4 });
  const first = await consumer.nextDelivery();
  assert.equal(first.attempt, 1);
  first.nack();
  const again = await consumer.nextDelivery();
  assert.equal(again.event.id, 'n-1');
  assert.equal(again.attempt, 2);
  again.ack();
  await until(() => drained(broker.admin, 's-nack'), 's-nack drained');
  await consumer.close();
});

for (const transport of ['websocket', 'sse', 'longpoll']) {
  test(`${transport}: an unknown subscription is a 404 EvmeshError and the iteration ends`, async () => {
    const consumer = client.consumer('no-such-subscription', { transport });
    await assert.rejects(
      async () => {
        for await (const d of consumer) assert.fail(`unexpected delivery ${d.id}`);
      },
      (e) => e instanceof EvmeshError && e.status === 404 && /no subscription/.test(e.detail),
    );
    assert.equal(consumer.state.kind, 'closed');
    assert.equal(await consumer.nextDelivery(), undefined);
    await consumer.close();
  });
}

test('request-reply: a responder served through a consumer answers; no responder is a 504', async () => {
  await client.subscribe({ subscription: 'rpc-responder', topic: 'rpc' });
  const responder = client.consumer('rpc-responder');
  await stateReached(responder, 'connected');
  const served = client.serve(responder, (req) => ({
    specversion: '1.0',
    id: `reply-${req.id}`,
    source: '/responder',
    type: 'com.example.reply',
    data: { echo: req.data },
  }));
  const replies = await Promise.all(
    [1, 2, 3].map((i) => client.request('rpc', event(`q-${i}`, { data: { q: i } }), 10_000)),
  );
  assert.deepEqual(
    replies.map((r) => [r.id, r.data]),
    [1, 2, 3].map((i) => [`reply-q-${i}`, { echo: { q: i } }]),
  );
  await responder.close();
  await served;
  await assert.rejects(client.request('rpc-nobody', event('q-x'), 200), (e) => e instanceof EvmeshError && e.status === 504);
  await assert.rejects(client.reply(event('no-correlation'), event('r')), (e) => e.kind === 'config');
  await assert.rejects(client.reply(event('late', { emcorrelationid: 'bogus' }), event('r')), (e) => e.status === 404);
});
