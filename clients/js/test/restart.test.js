// A broker killed (SIGKILL) and restarted on the same ports and data dir while a consumer with
// acks runs: every event arrives, the consumer reconnects by itself, and what comes twice is at
// most what was delivered and not yet acknowledged (the window on each shard).
import assert from 'node:assert/strict';
import { rm } from 'node:fs/promises';
import { test } from 'node:test';

import { Client } from '../dist/index.js';
import { WebSocketImpl, drained, event, startBroker, stateReached, until } from '../test-support/broker.js';

const SHARDS = 2;

for (const transport of ['websocket', 'sse']) {
  test(`${transport}: a consumer with acks survives a kill -9 and restart of the broker`, async (t) => {
    let broker = await startBroker({ durability: 'os' });
    const { trafficPort, adminPort, dataDir } = broker;
    t.after(async () => {
      await broker.kill();
      await rm(dataDir, { recursive: true, force: true });
    });
    const client = new Client(broker.url, { WebSocket: WebSocketImpl, backoff: { minMs: 50, maxMs: 1000 } });
    await client.subscribe({ subscription: 'survivor', topic: 'crash', start: 'earliest' });
    const ids = Array.from({ length: 300 }, (_, i) => `c-${i}`);
    await client.publishBatch('crash', ids.slice(0, 150).map((id) => event(id)));

    const window = 8;
    const consumer = client.consumer('survivor', { transport, window });
    let connects = 0;
    consumer.onState((s) => {
      if (s.kind === 'connected') connects += 1;
    });
    const counts = new Map();
    let halfway;
    const reachedHalfway = new Promise((r) => (halfway = r));
    const reading = (async () => {
      for await (const d of consumer) {
        counts.set(d.event.id, (counts.get(d.event.id) ?? 0) + 1);
        d.ack();
        if (counts.size >= 50) halfway();
        if (counts.size === ids.length) return;
      }
    })();

    await reachedHalfway;
    await broker.kill();
    await stateReached(consumer, 'disconnected');
    broker = await startBroker({ dataDir, trafficPort, adminPort, durability: 'os' });
    // Published after the restart, to the same ports: the consumer must have come back for these.
    await client.publishBatch('crash', ids.slice(150).map((id) => event(id)));
    await reading;

    assert.deepEqual([...counts.keys()].sort(), [...ids].sort(), 'every event arrived');
    assert.ok(connects >= 2, `reconnected by itself (${connects} attaches)`);
    const duplicates = [...counts.values()].reduce((a, n) => a + n - 1, 0);
    assert.ok(duplicates <= window * SHARDS, `${duplicates} duplicates, at most ${window * SHARDS}`);
    t.diagnostic(`${duplicates} duplicates, ${connects} attaches`);
    await until(() => drained(broker.admin, 'survivor'), 'survivor drained');
  });
}
