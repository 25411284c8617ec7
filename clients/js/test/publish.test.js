// Publishing and subscriptions against a real broker.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Client, EvmeshError } from '../dist/index.js';
import { WebSocketImpl, event, startBroker } from '../test-support/broker.js';

let broker;
let client;
before(async () => {
  broker = await startBroker();
  client = new Client(broker.url, { WebSocket: WebSocketImpl });
});
after(() => broker?.stop());

/** The stored events of `topic` (every partition), as the admin API lists them. */
async function stored(topic) {
  const topics = await (await fetch(`${broker.admin}/admin/topics`)).json();
  const t = topics.find((x) => x.topic === topic);
  const out = [];
  for (const p of t.partitions) {
    const evs = await (await fetch(`${broker.admin}/admin/topics/${topic}/partitions/${p.partition}/events?from=0&max=1000`)).json();
    out.push(...evs.map((e) => e.event));
  }
  return out;
}

test('publish: structured, binary and batch are stored as sent', async () => {
  const a = await client.publish('pub', event('s-1', { subject: 'structured' }));
  assert.ok(Number.isInteger(a.partition) && Number.isInteger(a.offset));
  const b = await client.publish('pub', event('b-1', { subject: 'café "bin" 100%', partitionkey: 'k1' }), { mode: 'binary' });
  assert.ok(Number.isInteger(b.offset));
  const batch = await client.publishBatch('pub', [event('m-1'), event('m-2'), event('m-3', { partitionkey: 'k1' })]);
  assert.equal(batch.length, 3);
  assert.equal(batch[2].partition, b.partition, 'one partition key, one partition');
  const got = new Map((await stored('pub')).map((e) => [e.id, e]));
  assert.deepEqual([...got.keys()].sort(), ['b-1', 'm-1', 'm-2', 'm-3', 's-1']);
  assert.equal(got.get('b-1').subject, 'café "bin" 100%');
  assert.deepEqual(got.get('b-1').data, { n: 'b-1' });
  assert.equal(got.get('s-1').subject, 'structured');
});

test('publish: an invalid event is refused with a 400 problem, a bad batch stores nothing', async () => {
  await assert.rejects(
    client.publish('pub-bad', { specversion: '0.3', id: 'x', source: '/s', type: 't' }),
    (e) => e instanceof EvmeshError && e.status === 400 && typeof e.detail === 'string' && e.problem.status === 400,
  );
  await assert.rejects(client.publishBatch('pub-bad', [event('ok-1'), { ...event('bad-1'), specversion: '2.0' }]), (e) => e.status === 400);
  const topics = await (await fetch(`${broker.admin}/admin/topics`)).json();
  const t = topics.find((x) => x.topic === 'pub-bad');
  assert.ok(t === undefined || t.partitions.every((p) => p.end_offset === 0), 'nothing of the refused batch stored');
  // The client refuses what is not an event before sending anything.
  await assert.rejects(client.publish('pub-bad', { id: 'x' }), (e) => e.kind === 'config');
});

test('publisher: pipelined over one WebSocket, every event answered with its own result', async () => {
  const publisher = await client.publisher('piped', { maxInFlight: 16 });
  const ids = Array.from({ length: 300 }, (_, i) => `p-${i}`);
  const results = await Promise.all(ids.map((id) => publisher.send(event(id))));
  assert.equal(results.length, 300);
  assert.ok(results.every((r) => Number.isInteger(r.partition) && Number.isInteger(r.offset)));
  // Within a partition, offsets grow in send order.
  const last = new Map();
  for (const r of results) {
    assert.ok(r.offset > (last.get(r.partition) ?? -1));
    last.set(r.partition, r.offset);
  }
  // A refused event rejects only its own promise.
  const bad = publisher.send({ ...event('bad'), specversion: '9.9' });
  const good = publisher.send(event('after-bad'));
  await assert.rejects(bad, (e) => e instanceof EvmeshError && e.status === 400);
  assert.ok(Number.isInteger((await good).offset));
  for (let i = 0; i < 50; i++) {
    await publisher.ready();
    void publisher.send(event(`r-${i}`));
  }
  await publisher.flush();
  await publisher.close();
  await assert.rejects(publisher.send(event('late')), (e) => e.kind === 'disconnected');
  const got = new Set((await stored('piped')).map((e) => e.id));
  assert.equal(got.size, 300 + 1 + 50);
  assert.ok(ids.every((id) => got.has(id)));
});

test('subscribe: 201 created, 200 the same again, 409 a different definition; unsubscribe', async () => {
  const sub = { subscription: 'idem', topic: 'orders', mode: 'LOAD_BALANCE', filters: [{ prefix: { type: 'com.' } }], start: 'earliest', ackTimeoutMs: 30000, maxAttempts: 6 };
  const first = await client.subscribe(sub);
  assert.equal(first.created, true);
  assert.equal(first.instanceUrl, broker.url);
  assert.equal((await client.subscribe(sub)).created, false);
  await assert.rejects(client.subscribe({ ...sub, topic: 'other' }), (e) => e instanceof EvmeshError && e.status === 409 && e.title === 'Conflict');
  await assert.rejects(client.subscribe({ subscription: 'bad-sql', topic: 'orders', filters: [{ sql: 'amount >' }] }), (e) => e.status === 400);
  await client.unsubscribe('idem');
  assert.equal((await client.subscribe({ ...sub, topic: 'other' })).created, true);
});
