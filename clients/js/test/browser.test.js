// The client in a real headless browser (Debian's chromium, driven by puppeteer-core): the page
// imports /dist/index.js, publishes, consumes with acks over WebSocket and over SSE, and keeps
// consuming across a broker restart on the same ports.
//
// The main test serves the page from the broker's origin, the way a deployment behind one
// front does: a tiny node:http server serves dist/ and the page, and passes every other path
// (HTTP and WebSocket upgrades) to the broker's traffic port; the broker advertises that origin
// (`--advertised-url`) so recommend names it. The last test calls the broker from a page of
// another origin, which the broker allows with `cors_allowed_origins`.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile, rm } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import { dirname, extname, join, normalize } from 'node:path';
import { pipeline } from 'node:stream';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { drained, startBroker, until } from '../test-support/broker.js';

const DIST = join(dirname(fileURLToPath(import.meta.url)), '..', 'dist');

function findChromium() {
  if (existsSync('/usr/bin/chromium')) return '/usr/bin/chromium';
  try {
    return execFileSync('which', ['chromium'], { encoding: 'utf8' }).trim() || undefined;
  } catch {
    return undefined;
  }
}

/** Tests that failed, whose page log is worth telling. */
const failed = new WeakSet();

/** Runs `body`, marking `t` failed when it throws. */
async function marking(t, body) {
  try {
    await body();
  } catch (e) {
    failed.add(t);
    throw e;
  }
}

const PAGE = `<!doctype html><meta charset="utf-8"><title>evmesh client</title>
<script type="module">
  import * as evmesh from '/dist/index.js';
  window.evmesh = evmesh;
  document.title = 'ready';
</script>`;

/** Serves the page and dist/, and passes everything else to the broker at `target().port`. */
async function startFront(target) {
  const server = http.createServer(async (req, res) => {
    const path = new URL(req.url, 'http://x').pathname;
    if (path === '/favicon.ico') {
      res.writeHead(204).end();
      return;
    }
    if (path === '/' || path === '/index.html') {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(PAGE);
      return;
    }
    if (path.startsWith('/dist/')) {
      const file = normalize(join(DIST, path.slice('/dist/'.length)));
      if (!file.startsWith(DIST)) return res.writeHead(403).end();
      try {
        const body = await readFile(file);
        const type = { '.js': 'text/javascript', '.map': 'application/json', '.ts': 'text/plain' }[extname(file)] ?? 'application/octet-stream';
        res.writeHead(200, { 'content-type': type }).end(body);
      } catch {
        res.writeHead(404).end();
      }
      return;
    }
    const up = http.request({ host: '127.0.0.1', port: target().port, method: req.method, path: req.url, headers: req.headers, agent: false }, (ur) => {
      res.writeHead(ur.statusCode, ur.headers);
      pipeline(ur, res, () => {});
    });
    up.on('error', () => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/html' }).end('<html><body>broker away</body></html>');
      else res.destroy();
    });
    res.on('close', () => up.destroy());
    pipeline(req, up, () => {});
  });
  server.on('upgrade', (req, socket, head) => {
    const up = net.connect(target().port, '127.0.0.1', () => {
      let raw = `${req.method} ${req.url} HTTP/1.1\r\n`;
      for (let i = 0; i < req.rawHeaders.length; i += 2) raw += `${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}\r\n`;
      up.write(`${raw}\r\n`);
      if (head.length > 0) up.write(head);
      socket.pipe(up).pipe(socket);
    });
    const drop = () => {
      up.destroy();
      socket.destroy();
    };
    up.on('error', drop).on('close', drop);
    socket.on('error', drop).on('close', drop);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(r);
      }),
  };
}

/** A browser with the page loaded from `origin`; what the page logs is told when the test fails (or always, with `verbose`). */
async function openPage(t, executablePath, origin, verbose = false) {
  const { default: puppeteer } = await import('puppeteer-core');
  const browser = await puppeteer.launch({ executablePath, args: ['--no-sandbox', '--headless=new'] });
  t.after(() => browser.close());
  const page = await browser.newPage();
  const log = [];
  page.on('console', (m) => log.push(`console.${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => log.push(`pageerror: ${e.message}`));
  t.after(() => {
    if (log.length > 0 && (verbose || failed.has(t))) for (const line of log.slice(-20)) t.diagnostic(line);
  });
  await page.goto(`${origin}/`);
  await page.waitForFunction(() => document.title === 'ready' || document.title === 'failed', { timeout: 0 });
  return page;
}

test('browser: publish, consume with acks over WebSocket and SSE, across a broker restart', async (t) => {
  const chromium = findChromium();
  if (!chromium) return t.skip('chromium not found (apt-get install -y chromium)');
  let broker;
  const front = await startFront(() => ({ port: broker.trafficPort }));
  t.after(front.close);
  broker = await startBroker({ durability: 'os', args: ['--advertised-url', front.url] });
  const { trafficPort, adminPort, dataDir } = broker;
  t.after(async () => {
    await broker.kill();
    await rm(dataDir, { recursive: true, force: true });
  });
  const page = await openPage(t, chromium, front.url);
  await marking(t, () => scenario(t, page, front, () => broker, (b) => (broker = b), { trafficPort, adminPort, dataDir }));
});

/** The page's part of the first test: publish, consume over both transports, restart, consume on. */
async function scenario(t, page, front, current, replace, { trafficPort, adminPort, dataDir }) {
  const published = await page.evaluate(async () => {
    const { Client, EvmeshError } = window.evmesh;
    const client = new Client(location.origin, { backoff: { minMs: 50, maxMs: 1000 } });
    window.client = client;
    const ev = (id) => ({ specversion: '1.0', id, source: '/browser', type: 'com.example.browser', data: { id } });
    for (const name of ['b-ws', 'b-sse']) await client.subscribe({ subscription: name, topic: 'browser', start: 'earliest' });
    const out = [];
    out.push(await client.publish('browser', ev('one')));
    out.push(await client.publish('browser', ev('two'), { mode: 'binary' }));
    out.push(...(await client.publishBatch('browser', [ev('three'), ev('four')])));
    const publisher = await client.publisher('browser', { maxInFlight: 4 });
    out.push(...(await Promise.all(Array.from({ length: 16 }, (_, i) => publisher.send(ev(`piped-${i}`))))));
    await publisher.close();
    let refused;
    try {
      await client.publish('browser', { ...ev('bad'), specversion: '0.1' });
    } catch (e) {
      refused = e instanceof EvmeshError ? e.status : String(e);
    }
    window.seen = {};
    window.attaches = {};
    window.consumers = {};
    for (const transport of ['websocket', 'sse']) {
      const name = transport === 'websocket' ? 'b-ws' : 'b-sse';
      const seen = (window.seen[transport] = []);
      window.attaches[transport] = 0;
      const consumer = client.consumer(name, { transport, window: 8 });
      window.consumers[transport] = consumer;
      consumer.onState((s) => {
        if (s.kind === 'connected') window.attaches[transport] += 1;
      });
      (async () => {
        for await (const d of consumer) {
          seen.push(d.event.id);
          d.ack();
        }
      })().catch((e) => (window.failed = String(e)));
    }
    return { count: out.length, ok: out.every((p) => Number.isInteger(p.partition) && Number.isInteger(p.offset)), refused };
  });
  assert.deepEqual(published, { count: 20, ok: true, refused: 400 });

  const uniq = (n) => `['websocket', 'sse'].every((k) => new Set(window.seen[k]).size >= ${n})`;
  await page.waitForFunction(uniq(20), { timeout: 0, polling: 50 });

  await current().kill();
  await page.waitForFunction(() => window.consumers.websocket.state.kind !== 'connected' && window.consumers.sse.state.kind !== 'connected', { timeout: 0, polling: 50 });
  replace(await startBroker({ dataDir, trafficPort, adminPort, durability: 'os', args: ['--advertised-url', front.url] }));

  await page.evaluate(async () => {
    const ev = (id) => ({ specversion: '1.0', id, source: '/browser', type: 'com.example.browser', data: { id } });
    await window.client.publishBatch('browser', Array.from({ length: 20 }, (_, i) => ev(`after-${i}`)));
  });
  await page.waitForFunction(uniq(40), { timeout: 0, polling: 50 });
  const result = await page.evaluate(async () => {
    await Promise.all(Object.values(window.consumers).map((c) => c.close()));
    return { seen: window.seen, attaches: window.attaches, failed: window.failed ?? null, states: Object.values(window.consumers).map((c) => c.state.kind) };
  });
  assert.equal(result.failed, null);
  assert.deepEqual(result.states, ['closed', 'closed']);
  for (const transport of ['websocket', 'sse']) {
    const ids = new Set(result.seen[transport]);
    assert.equal(ids.size, 40, transport);
    for (let i = 0; i < 20; i++) assert.ok(ids.has(`after-${i}`), `${transport}: after-${i}`);
    assert.ok(result.attaches[transport] >= 2, `${transport} reconnected by itself`);
    // What comes twice is what was delivered and not yet acknowledged: the window on each shard.
    assert.ok(result.seen[transport].length - ids.size <= 8 * 2, `${transport}: ${result.seen[transport].length - ids.size} duplicates`);
  }
  // The last acknowledgements reach their partitions' shards after the consumers closed (a
  // WebSocket ack has no answer to wait for): waited for, 10 s at most.
  for (const name of ['b-ws', 'b-sse']) {
    const limit = new Promise((r) => setTimeout(() => r('10 s'), 10_000).unref());
    await until(() => drained(current().admin, name), `${name}: every delivery acknowledged`, limit);
  }
}

test('browser: a page on another origin than the broker (cors_allowed_origins)', async (t) => {
  const chromium = findChromium();
  if (!chromium) return t.skip('chromium not found (apt-get install -y chromium)');
  // The page's origin is the front's; the broker allows exactly it.
  let broker;
  const front = await startFront(() => ({ port: broker.trafficPort }));
  t.after(front.close);
  broker = await startBroker({ args: ['--cors-allowed-origins', front.url] });
  t.after(() => broker.stop());
  const preflight = await fetch(`${broker.url}/events/publish?topic=x`, {
    method: 'OPTIONS',
    headers: { origin: front.url, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' },
  });
  assert.equal(preflight.status, 204);
  assert.equal(preflight.headers.get('access-control-allow-origin'), front.url);
  const page = await openPage(t, chromium, front.url, true);
  const outcome = await page.evaluate(async (brokerUrl) => {
    const { Client } = window.evmesh;
    const client = new Client(brokerUrl);
    try {
      await client.subscribe({ subscription: 'cross', topic: 'cross', start: 'earliest' });
      await client.publish('cross', { specversion: '1.0', id: 'x-1', source: '/browser', type: 't' });
      const consumer = client.consumer('cross', { transport: 'sse' });
      for await (const d of consumer) {
        d.ack();
        await consumer.close();
        return `consumed ${d.event.id}`;
      }
      return 'ended';
    } catch (e) {
      return `${e.name} ${e.kind}: ${e.message}`;
    }
  }, broker.url);
  assert.equal(outcome, 'consumed x-1');
});
