// Streaming sessions against a real broker: an agent attached through Agent.attach answering
// turns chunk by chunk, end-turn / cancel / close, and session pub/sub.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Agent, Client, EvmeshError } from '../dist/index.js';
import { WebSocketImpl, event, startBroker, stateReached } from '../test-support/broker.js';

let broker;
let client;
before(async () => {
  broker = await startBroker();
  client = new Client(broker.url, { WebSocket: WebSocketImpl, backoff: { minMs: 50, maxMs: 500 } });
});
after(() => broker?.stop());

/** Every chunk of a turn. */
async function chunks(stream) {
  const out = [];
  for await (const c of stream) out.push(c);
  return out;
}

test('a streaming call: the agent answers a turn chunk by chunk; several turns; end-turn, cancel and close', async () => {
  const agent = await Agent.attach(client, 'echo-agent', { heartbeatMs: 10_000 });
  await stateReached(agent, 'connected');
  const controls = [];
  let waiting; // the turn the agent holds open for end-turn / cancel
  const agentDone = (async () => {
    for await (const ev of agent) {
      if (ev.type === 'turn') {
        const { turn } = ev;
        if (turn.prompt.startsWith('hold')) {
          turn.chunk(`holding ${turn.turn}`);
          waiting = turn;
          continue;
        }
        for (const word of turn.prompt.split(' ')) turn.chunk(word);
        turn.chunk({ turn: turn.turn, session: turn.sessionId });
        turn.done('.');
      } else {
        controls.push(ev.type);
      }
    }
  })();

  const session = await client.streaming().openSession('client-1', 'echo-agent');
  assert.match(session.id, /^echo-agent:/);
  assert.equal(session.agentId, 'echo-agent');

  const first = await chunks(await session.call('hello streaming world'));
  assert.deepEqual(
    first.map((c) => [c.kind, c.data]),
    [
      ['chunk', 'hello'],
      ['chunk', 'streaming'],
      ['chunk', 'world'],
      ['chunk', JSON.stringify({ turn: 1, session: session.id })],
      ['done', '.'],
    ],
  );
  assert.deepEqual(first.map((c) => c.seq), [0, 1, 2, 3, 4]);

  const second = await chunks(await session.call('again'));
  assert.deepEqual(second.map((c) => c.data), ['again', JSON.stringify({ turn: 2, session: session.id }), '.']);

  // end-turn: the held turn's stream ends with done.
  const held = await session.call('hold one');
  const heldChunks = [];
  for await (const c of held) {
    heldChunks.push(c);
    if (c.data === 'holding 3') await session.endTurn();
  }
  assert.deepEqual(heldChunks.map((c) => c.kind), ['chunk', 'done']);

  // cancel: the stream ends with an error, cancelled.
  const cancelled = [];
  for await (const c of await session.call('hold two')) {
    cancelled.push(c);
    if (c.kind === 'chunk') await session.cancel();
  }
  assert.deepEqual(cancelled.map((c) => c.kind), ['chunk', 'error']);
  assert.match(cancelled[1].data, /cancel/);
  assert.ok(waiting);

  await session.close();
  await assert.rejects(session.call('after close'), (e) => e instanceof EvmeshError && e.status >= 400);
  await agent.close();
  await agentDone;
  assert.deepEqual(controls, ['end-turn', 'cancel', 'close']);
});

test('a session of an unknown agent is refused with a problem', async () => {
  await assert.rejects(client.streaming().openSession('client-2', 'nobody-home'), (e) => e instanceof EvmeshError && e.status === 503);
});

test('session pub/sub: replayed from the head, then followed; a second subscriber is a 409', async () => {
  const streaming = client.streaming();
  const publisher = streaming.sessionPublisher('room-1');
  for (let i = 0; i < 3; i++) {
    const p = await publisher.publish(event(`e-${i}`));
    assert.equal(p.offset, i);
  }
  const sub = streaming.subscribeSession('room-1');
  const got = [];
  const it = sub[Symbol.asyncIterator]();
  for (let i = 0; i < 3; i++) got.push((await it.next()).value.id);
  assert.equal(sub.state.kind, 'connected');
  const second = streaming.subscribeSession('room-1');
  await assert.rejects(second[Symbol.asyncIterator]().next(), (e) => e instanceof EvmeshError && e.status === 409);
  for (let i = 3; i < 5; i++) await publisher.publish(event(`e-${i}`));
  for (let i = 3; i < 5; i++) got.push((await it.next()).value.id);
  assert.deepEqual(got, ['e-0', 'e-1', 'e-2', 'e-3', 'e-4']);
  await sub.close();
  assert.equal((await it.next()).done, true);
});
