// Unit tests of the parts that need no broker: SSE parsing, errors from bad answers, backoff,
// binary mode, redirects and token refresh (against a tiny node:http server), and bad frames.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';

import { Client, EvmeshError, SseParser, backoffDelay, percentEncode, toBinary } from '../dist/index.js';
import { redirectTarget } from '../dist/client.js';
import { WebSocketImpl, event } from '../test-support/broker.js';

/** A node:http server answering with `handler`; resolves with its URL and a closer. */
async function serve(handler) {
  const server = http.createServer(handler);
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${server.address().port}`;
  return {
    server,
    url,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(r);
      }),
  };
}

function body(req) {
  return new Promise((resolve) => {
    let b = '';
    req.on('data', (c) => (b += c));
    req.on('end', () => resolve(b));
  });
}

test('SSE events come out whole at every split point, bad lines skipped', () => {
  const text = ': hello\r\nid: d-1\nevent: chunk\ndata: {"a":\ndata: 1}\n\nid:d-2\ndata:x\r\n\r\nno colon here\n: hb\n\nretry: 5\nunknown: y\ndata\n\n';
  const expected = [
    { id: 'd-1', event: 'chunk', data: '{"a":\n1}' },
    { id: 'd-2', data: 'x' },
    { data: '' },
  ];
  const bytes = new TextEncoder().encode(text);
  for (let split = 0; split <= bytes.length; split++) {
    const p = new SseParser();
    const got = [...p.feedBytes(bytes.slice(0, split)), ...p.feedBytes(bytes.slice(split))];
    assert.deepEqual(got, expected, `split at ${split}`);
  }
  // Multi-byte characters split across chunks stay whole.
  const euro = new TextEncoder().encode('data: €\n\n');
  const p = new SseParser();
  assert.deepEqual([...p.feedBytes(euro.slice(0, 7)), ...p.feedBytes(euro.slice(7))], [{ data: '€' }]);
});

test('a refusal keeps its problem fields; a body that is not JSON becomes a short detail', () => {
  const e = EvmeshError.fromAnswer(429, '3', '{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"over the topic\'s rate"}');
  assert.equal(e.status, 429);
  assert.equal(e.title, 'Too Many Requests');
  assert.equal(e.detail, "over the topic's rate");
  assert.equal(e.retryAfterMs, 3000);
  assert.equal(e.problem.status, 429);
  assert.equal(e.transient, true);
  const html = EvmeshError.fromAnswer(502, null, `<html><body>${'x'.repeat(5000)}</body></html>`);
  assert.equal(html.title, 'Bad Gateway');
  assert.ok(html.detail.startsWith('<html>') && html.detail.length < 600);
  assert.equal(html.transient, true);
  const empty = EvmeshError.fromAnswer(404, undefined, '');
  assert.equal(empty.detail, undefined);
  assert.equal(empty.problem, null);
  assert.equal(empty.transient, false);
  assert.ok(empty instanceof Error);
});

test('backoff delays stay between min and max and spread', () => {
  const b = { minMs: 500, maxMs: 20_000 };
  for (let step = 0; step < 40; step++) {
    for (let i = 0; i < 200; i++) {
      const d = backoffDelay(b, step);
      assert.ok(d >= 500 && d <= 20_000, `${step}: ${d}`);
    }
  }
  const late = new Set(Array.from({ length: 200 }, () => Math.floor(backoffDelay(b, 10) / 1000)));
  assert.ok(late.size > 5, `full jitter spreads: ${[...late]}`);
  for (let i = 0; i < 200; i++) assert.ok(backoffDelay(b, 0) <= 1000);
});

test('binary mode puts attributes in percent-encoded headers', () => {
  const { headers, body } = toBinary({
    specversion: '1.0',
    id: 'a-1',
    source: '/s',
    type: 't',
    subject: 'café "x" 100%',
    partitionkey: 'k',
    datacontenttype: 'application/json',
    data: { a: 1 },
  });
  assert.equal(headers['ce-id'], 'a-1');
  assert.equal(headers['ce-specversion'], '1.0');
  assert.equal(headers['ce-subject'], 'caf%C3%A9%20%22x%22%20100%25');
  assert.equal(headers['ce-partitionkey'], 'k');
  assert.equal(headers['content-type'], 'application/json');
  assert.equal(headers['ce-datacontenttype'], undefined);
  assert.equal(new TextDecoder().decode(body), '{"a":1}');
  assert.equal(percentEncode('a b'), 'a%20b');
  const text = toBinary({ specversion: '1.0', id: 'b', source: '/s', type: 't', data: 'plain' });
  assert.equal(text.headers['content-type'], 'text/plain; charset=utf-8');
  assert.throws(() => toBinary({ specversion: '1.0', id: 'b', source: '/s' }), EvmeshError);
});

test('redirects never leave https, stop after three, need a location', () => {
  const https = new URL('https://a:8080/events/ws?subscription=s');
  assert.throws(() => redirectTarget(https, 'http://b:8080/events/ws', 1), (e) => e.kind === 'redirect');
  assert.equal(redirectTarget(https, 'https://b:9090/x?evmeshRedirected=1', 1).toString(), 'https://b:9090/x?evmeshRedirected=1');
  const plain = new URL('http://a/x');
  assert.equal(redirectTarget(plain, '/y?z=1', 1).toString(), 'http://a/y?z=1');
  assert.throws(() => redirectTarget(plain, 'http://b/', 4), (e) => e.kind === 'redirect');
  assert.throws(() => redirectTarget(plain, null, 1), (e) => e.kind === 'redirect');
  assert.throws(() => redirectTarget(plain, 'file:///etc/passwd', 1), (e) => e.kind === 'redirect');
  assert.throws(() => new Client('ftp://x'), (e) => e instanceof EvmeshError && e.kind === 'config');
  assert.throws(() => new Client('not a url'), (e) => e instanceof EvmeshError && e.kind === 'config');
});

test('307 is followed with method and body kept, at most three times', async (t) => {
  const seen = [];
  const srv = await serve(async (req, res) => {
    const b = await body(req);
    seen.push(`${req.method} ${req.url} ${b.length}`);
    const hop = Number(new URL(req.url, 'http://x').searchParams.get('hop') ?? '0');
    const limit = req.url.includes('topic=far') ? 9 : 2;
    if (hop < limit) {
      res.writeHead(307, { location: `/events/publish?topic=${req.url.includes('far') ? 'far' : 'near'}&hop=${hop + 1}` }).end();
      return;
    }
    res.writeHead(202, { 'content-type': 'application/json' }).end('{"partition":1,"offset":"41"}');
  });
  t.after(srv.close);
  const client = new Client(srv.url);
  const p = await client.publish('near', event('r-1'));
  assert.deepEqual(p, { partition: 1, offset: 41 });
  assert.equal(seen.length, 3);
  assert.ok(seen.every((s) => s.startsWith('POST ') && !s.endsWith(' 0')), seen.join('\n'));
  await assert.rejects(client.publish('far', event('r-2')), (e) => e.kind === 'redirect' && /more than 3/.test(e.message));
});

test('a 401 refreshes the token once and retries; a second 401 stands', async (t) => {
  const auths = [];
  const srv = await serve(async (req, res) => {
    await body(req);
    auths.push(req.headers.authorization);
    if (req.headers.authorization === 'Bearer good') {
      res.writeHead(202, { 'content-type': 'application/json' }).end('{"partition":0,"offset":0}');
    } else {
      res.writeHead(401, { 'content-type': 'application/problem+json', 'www-authenticate': 'Bearer' }).end('{"title":"Unauthorized","status":401,"detail":"token expired"}');
    }
  });
  t.after(srv.close);
  let calls = 0;
  const tokens = ['stale', 'good'];
  const client = new Client(srv.url, { tokenRefresh: async () => ({ value: tokens[calls++] ?? 'bad' }) });
  assert.deepEqual(await client.publish('t', event('a')), { partition: 0, offset: 0 });
  assert.deepEqual(auths, ['Bearer stale', 'Bearer good']);
  assert.equal(calls, 2);
  // A static token has nothing to refresh with.
  const fixed = new Client(srv.url, { token: 'nope' });
  await assert.rejects(fixed.publish('t', event('b')), (e) => e.status === 401 && e.detail === 'token expired');
});

test('a 5xx with an HTML body, a 200 that is not JSON, a dead port: each an EvmeshError', async (t) => {
  const srv = await serve(async (req, res) => {
    await body(req);
    if (req.url.startsWith('/events/publish?topic=html')) {
      res.writeHead(502, { 'content-type': 'text/html' }).end('<html><h1>502 Bad Gateway</h1></html>');
    } else {
      res.writeHead(202, { 'content-type': 'application/json' }).end('surprise');
    }
  });
  t.after(srv.close);
  const client = new Client(srv.url);
  await assert.rejects(client.publish('html', event('a')), (e) => e instanceof EvmeshError && e.status === 502 && e.detail.includes('502 Bad Gateway'));
  await assert.rejects(client.publish('text', event('a')), (e) => e instanceof EvmeshError && e.kind === 'protocol');
  const dead = new Client('http://127.0.0.1:1', { timeoutMs: 5000 });
  await assert.rejects(dead.publish('t', event('a')), (e) => e instanceof EvmeshError && e.kind === 'http' && e.transient);
});

test('SSE lines without a colon and data that is not an event are skipped, the rest delivered', async (t) => {
  const acks = [];
  const srv = await serve(async (req, res) => {
    const url = new URL(req.url, 'http://x');
    if (url.pathname === '/session/recommend') {
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"instanceUrl":"not a url"}');
    } else if (url.pathname === '/events/sse') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('garbage without colon\n\n');
      res.write('id: x\ndata: {not json\n\n');
      res.write('id: y\ndata: {"specversion":"1.0","id":"e0","source":"/s","type":"t"}\n\n');
      res.write('id: 0:0:5\ndata: {"specversion":"1.0","id":"e1","source":"/s","type":"t","emdeliveryid":"0:0:5","empartition":0,"emoffset":"5","emattempt":2}\n\n');
    } else if (url.pathname === '/events/ack') {
      acks.push(JSON.parse(await body(req)));
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"acked":1}');
    } else {
      res.writeHead(404).end();
    }
  });
  t.after(srv.close);
  const errors = [];
  const consumer = new Client(srv.url).consumer('s', { transport: 'sse', onError: (e) => errors.push(e) });
  const d = await consumer.nextDelivery();
  assert.equal(d.event.id, 'e1');
  assert.deepEqual([d.id, d.partition, d.offset, d.attempt], ['0:0:5', 0, 5, 2]);
  d.ack();
  await consumer.close();
  assert.deepEqual(acks, [{ subscription: 's', ids: ['0:0:5'] }]);
  assert.equal(errors.length, 2);
  assert.ok(errors.every((e) => e instanceof EvmeshError && e.kind === 'protocol'));
  assert.equal(consumer.state.kind, 'closed');
});

test('a publisher answered with a frame that is not JSON fails its sends with an EvmeshError', async (t) => {
  const { WebSocketServer } = WebSocketImpl;
  if (WebSocketServer === undefined) return t.skip('the ws package is not the WebSocket here');
  const wss = new WebSocketServer({ port: 0, host: '127.0.0.1' });
  await new Promise((r) => wss.once('listening', r));
  t.after(() => new Promise((r) => wss.close(r)));
  wss.on('connection', (ws) => ws.on('message', () => ws.send('<html>nope</html>')));
  const client = new Client(`http://127.0.0.1:${wss.address().port}`, { WebSocket: WebSocketImpl });
  const publisher = await client.publisher('t');
  await assert.rejects(publisher.send(event('a')), (e) => e instanceof EvmeshError && e.kind === 'protocol');
  await assert.rejects(publisher.send(event('b')), (e) => e instanceof EvmeshError);
});

test('without a WebSocket the error names the option', async (t) => {
  if (globalThis.WebSocket !== undefined) return t.skip('this Node has a global WebSocket');
  const consumer = new Client('http://127.0.0.1:1').consumer('s');
  // recommend fails (dead port) and is retried; a publisher fails at once.
  await consumer.close();
  await assert.rejects(new Client('http://127.0.0.1:1').publisher('t'), (e) => e instanceof EvmeshError && e.kind === 'config' && /\{ WebSocket \}/.test(e.message));
});

test('a publisher keeps at most maxInFlight events unanswered', async (t) => {
  const { WebSocketServer } = WebSocketImpl;
  if (WebSocketServer === undefined) return t.skip('the ws package is not the WebSocket here');
  const wss = new WebSocketServer({ port: 0, host: '127.0.0.1' });
  await new Promise((r) => wss.once('listening', r));
  t.after(() => new Promise((r) => wss.close(r)));
  let most = 0;
  let offset = 0;
  // Answers only once four are waiting: a fifth before that would break the bound.
  wss.on('connection', (ws) => {
    let waiting = [];
    ws.on('message', (m) => {
      waiting.push(JSON.parse(m.toString()).id);
      most = Math.max(most, waiting.length);
      if (waiting.length === 4) {
        for (const id of waiting) ws.send(JSON.stringify({ type: 'published', id, partition: 0, offset: String(offset++) }));
        waiting = [];
      }
    });
  });
  const client = new Client(`http://127.0.0.1:${wss.address().port}`, { WebSocket: WebSocketImpl });
  const publisher = await client.publisher('t', { maxInFlight: 4 });
  const results = await Promise.all(Array.from({ length: 20 }, (_, i) => publisher.send(event(`e-${i}`))));
  assert.deepEqual(results.map((r) => r.offset), Array.from({ length: 20 }, (_, i) => i));
  assert.equal(most, 4);
  await publisher.close();
});
