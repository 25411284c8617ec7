// The web console (GET /console on the admin listener) in a real headless browser: Debian's
// chromium, driven by puppeteer-core (installed in clients/js by `npm ci`).
//
// One broker (2 shards, an admin token) and one browser for the whole file; the tests run in
// order and build on each other, as an operator would: the page without the credential gets
// nothing; with it, publishing moves a topic's count and rate, a subscription's lag moves per
// partition and a nacked event becomes a dead letter, which the page replays; the live tail
// shows only what its CESQL filter matches, and runs one loop however fast it is started and
// stopped; a policy is created, edited and deleted; every write the page makes says it comes
// from the console (x-evmesh-console); a 429 is waited out, and a credential the broker no
// longer takes stops the page's polling. Every wait is on a condition (page.waitForFunction or
// the broker's answers), never a sleep, except the windows in which requests are counted.
//
//   EVMESH_BIN=/path/to/evmesh node --test tests/console/
//
// EVMESH_CONSOLE_DIR (passed through to the broker) serves the page from a directory instead
// of the copy built into the binary; EVMESH_CONSOLE_SCREENSHOT, when set, is where the last
// test saves a screenshot of the subscriptions view.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { after, before, test } from 'node:test';

import { startBroker } from '../../clients/js/test-support/broker.js';

const require = createRequire(new URL('../../clients/js/package.json', import.meta.url));
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
/** The admin token (the broker wants 16 characters at least). */
const TOKEN = 'console-test-admin-token-5f3a9c';
/** How long a condition may take to show in the page (it polls every second). */
const WAIT = 20_000;

let broker;
let browser;
/** The signed-in page, shared by the tests after the first. */
let page;
/** What the signed-in page logged: told when a test fails, and checked for CSP refusals. */
const pageLog = [];
/** The writes (methods other than GET and HEAD) the signed-in page made, with their
 * `x-evmesh-console` header. */
const writes = [];

before(async () => {
  assert.ok(existsSync(CHROMIUM), `no browser at ${CHROMIUM} (apt-get install -y chromium, or set CHROMIUM)`);
  const puppeteer = require('puppeteer-core');
  // A short redelivery backoff, so a nacked event comes back at once.
  broker = await startBroker({ args: ['--admin-token', TOKEN, '--redelivery-backoff-ms', '50'] });
  browser = await puppeteer.launch({ executablePath: CHROMIUM, args: ['--no-sandbox', '--headless=new'] });
});

after(async () => {
  await browser?.close();
  await broker?.stop();
});

/** A test that, when it fails, tells what the page logged and the broker's last words. */
function step(name, body) {
  test(name, { timeout: 90_000 }, async (t) => {
    try {
      await body(t);
    } catch (e) {
      for (const line of ['page log:', ...pageLog, 'broker stderr (tail):', ...(broker?.stderr().slice(-2000).split('\n') ?? [])]) t.diagnostic(line);
      throw e;
    }
  });
}

// ---- the broker, from outside the page

async function admin(path, init = {}) {
  const r = await fetch(`${broker.admin}${path}`, { ...init, headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json', ...init.headers } });
  const text = await r.text();
  return { status: r.status, json: text ? JSON.parse(text) : undefined };
}

async function traffic(path, body) {
  const r = await fetch(`${broker.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, json: text ? JSON.parse(text) : undefined };
}

/** Publishes one structured CloudEvent; resolves to where it was stored. */
async function publish(topic, event) {
  const r = await fetch(`${broker.url}/events/publish?topic=${topic}`, {
    method: 'POST',
    headers: { 'content-type': 'application/cloudevents+json' },
    body: JSON.stringify({ specversion: '1.0', source: '/console-test', type: 'com.shop.order', ...event }),
  });
  const body = await r.text();
  assert.equal(r.status, 202, body);
  return JSON.parse(body);
}

/** Long-polls subscription `sub` until `want(events so far)` holds; resolves to those events. */
async function pollUntil(sub, want) {
  const got = [];
  const deadline = Date.now() + WAIT;
  while (!want(got)) {
    assert.ok(Date.now() < deadline, `poll of ${sub} gave ${JSON.stringify(got.map((e) => [e.id, e.emattempt]))}`);
    const r = await fetch(`${broker.url}/events/poll?subscription=${sub}&max=100&waitMs=1000`);
    if (r.status === 200) got.push(...(await r.json()));
    else assert.equal(r.status, 204);
  }
  return got;
}

async function ack(sub, ids, nack = false) {
  const r = await traffic('/events/ack', { subscription: sub, ids, nack });
  assert.equal(r.status, 200, JSON.stringify(r.json));
}

// ---- the page

/** Resolves once `fn(...args)` is truthy in the page; else fails saying `what`. */
async function waitFor(what, fn, ...args) {
  try {
    await page.waitForFunction(fn, { timeout: WAIT, polling: 100 }, ...args);
  } catch (e) {
    throw new Error(`waiting for ${what}: ${e.message}`);
  }
}

/** The text of the first element `sel` matches (undefined when none does). */
const text = (sel) => page.evaluate((s) => document.querySelector(s)?.textContent, sel);

/** Resolves once element `sel` reads exactly `want`; else fails with what it read. */
async function waitText(sel, want) {
  try {
    await page.waitForFunction((s, w) => document.querySelector(s)?.textContent === w, { timeout: WAIT, polling: 100 }, sel, want);
  } catch {
    assert.fail(`${sel} should read ${JSON.stringify(want)}, reads ${JSON.stringify(await text(sel))}`);
  }
}

/** The `data-id`s of the rows under `sel`, in page order. */
const ids = (sel) => page.$$eval(`${sel} tr[data-id]`, (rows) => rows.map((r) => r.dataset.id));

/** Resolves after `ms`: only for windows in which a page's requests are counted. */
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Whether request `r` is one of the live tail's (a partition's stored events). */
const isTail = (r) => /\/admin\/topics\/[^/]+\/partitions\/\d+\/events\?/.test(r.url());

/** Opens a section through its nav link, as a user would. */
async function open(view) {
  await page.click(`#nav a[data-view="${view}"]`);
  await waitFor(`the ${view} view`, (v) => !document.getElementById(`view-${v}`).hidden, view);
}

// ---- the tests

step('without the credential the page gets nothing', async () => {
  // No credential at all: a 401 asking for Basic, and not one more request (no script, no style).
  const anonymous = await browser.createBrowserContext();
  try {
    const p = await anonymous.newPage();
    const requests = [];
    p.on('request', (r) => requests.push(r.url()));
    const answered = p.waitForResponse(`${broker.admin}/console`, { timeout: WAIT });
    // Headless chromium has nobody to ask for a password: the navigation ends in an error page.
    const r = await p.goto(`${broker.admin}/console`).catch((e) => e);
    assert.ok(r instanceof Error ? /ERR_INVALID_AUTH_CREDENTIALS/.test(r.message) : r.status() === 401, String(r));
    const answer = await answered;
    assert.equal(answer.status(), 401);
    assert.equal(answer.headers()['www-authenticate'], 'Basic realm="evmesh-admin"');
    assert.deepEqual(requests, [`${broker.admin}/console`]);
    assert.equal(await p.evaluate(() => document.getElementById('nav')), null);
  } finally {
    await anonymous.close();
  }

  // A wrong credential: the 401 problem is all the page shows, no script ran, and the admin API
  // refuses the page's own requests.
  const wrong = await browser.createBrowserContext();
  try {
    const p = await wrong.newPage();
    const requests = [];
    p.on('request', (r) => requests.push(r.url()));
    await p.authenticate({ username: 'admin', password: `${TOKEN}-wrong` });
    const r = await p.goto(`${broker.admin}/console`);
    assert.equal(r.status(), 401);
    assert.deepEqual(requests, [`${broker.admin}/console`]);
    const seen = await p.evaluate(async () => ({
      body: document.body.textContent,
      console: document.documentElement.dataset.console ?? null,
      nav: document.getElementById('nav') !== null,
      topics: (await fetch('/admin/topics')).status,
      script: (await fetch('/console/console.js')).status,
    }));
    assert.deepEqual(seen, { body: JSON.stringify({ type: 'about:blank', title: 'Unauthorized', status: 401, detail: 'unknown token' }), console: null, nav: false, topics: 401, script: 401 });
  } finally {
    await wrong.close();
  }

  // The assets are behind the credential too, not only the page.
  for (const path of ['/console', '/console/console.js', '/console/console.css']) {
    const r = await fetch(`${broker.admin}${path}`);
    assert.equal(r.status, 401, path);
    assert.doesNotMatch(await r.text(), /createElement|evmesh console/, path);
  }
});

/** Where the events of the next tests went: partition -> events stored there. */
const stored = new Map();

step('with the credential, publishing moves the topic count and its rate', async () => {
  page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  page.on('console', (m) => pageLog.push(`console.${m.type()}: ${m.text()}`));
  page.on('pageerror', (e) => pageLog.push(`pageerror: ${e.message}`));
  page.on('request', (r) => {
    if (r.method() !== 'GET' && r.method() !== 'HEAD') writes.push({ method: r.method(), url: r.url(), header: r.headers()['x-evmesh-console'] });
  });
  await page.authenticate({ username: 'admin', password: TOKEN });
  const r = await page.goto(`${broker.admin}/console`);
  assert.equal(r.status(), 200);
  assert.match(r.headers()['content-security-policy'], /script-src 'self'; style-src 'self'/);
  await waitFor('the console to start', () => document.documentElement.dataset.console === 'ready');
  await waitFor('a first poll', () => Number(document.documentElement.dataset.polls) >= 1);
  assert.match(await text('#status'), /^Live/);
  const cluster = await admin('/admin/cluster');
  assert.equal(await text('#instance'), `${cluster.json.instanceId} · embedded`);

  assert.equal((await admin('/admin/topics/orders', { method: 'PUT', body: '{"partitions":2}' })).status, 201);
  await waitText('tr[data-topic="orders"] [data-field="events"]', '0');
  assert.equal(await text('tr[data-topic="orders"] [data-field="rate"]'), '0');

  for (const id of ['o-1', 'o-2', 'o-3', 'o-4']) {
    const { partition, offset } = await publish('orders', { id, data: { n: id } });
    stored.set(partition, [...(stored.get(partition) ?? []), { id, offset }]);
  }
  await waitText('tr[data-topic="orders"] [data-field="events"]', '4');
  await waitFor('a rate above 0', () => Number(document.querySelector('tr[data-topic="orders"] [data-field="rate"]').textContent) > 0);
  for (const p of [0, 1]) {
    await waitText(`tr[data-topic="orders"] .chip[data-partition="${p}"] b`, String(stored.get(p)?.length ?? 0));
  }
});

step('lag per partition moves live, and a nacked event becomes a dead letter', async () => {
  const sub = { subscription: 'billing', topic: 'orders', start: 'earliest', maxAttempts: 2, ackTimeoutMs: 60000 };
  assert.equal((await traffic('/events/subscribe', sub)).status, 201);
  await open('subscriptions');
  await waitFor('the billing card', () => document.querySelector('[data-sub="billing"]') !== null);
  assert.equal(await text('[data-sub="billing"] [data-fact="maxAttempts"]'), '2');

  // Read everything, acknowledge nothing: the lag is every event.
  const delivered = await pollUntil('billing', (got) => got.length >= 4);
  assert.deepEqual(delivered.map((e) => e.id).sort(), ['o-1', 'o-2', 'o-3', 'o-4']);
  await waitText('[data-sub="billing"] [data-field="total-lag"]', '4');

  // All but the last event published: its partition lags by one, the other by none.
  const victim = delivered.find((e) => e.id === 'o-4');
  await ack('billing', delivered.filter((e) => e !== victim).map((e) => e.emdeliveryid));
  await waitText('[data-sub="billing"] [data-field="total-lag"]', '1');
  for (const p of [0, 1]) {
    if (stored.has(p)) await waitText(`[data-sub="billing"] tr[data-partition="${p}"] [data-field="lag"]`, p === victim.empartition ? '1' : '0');
  }

  // Nacked maxAttempts times: dead-lettered, and acknowledged on the source.
  await ack('billing', [victim.emdeliveryid], true);
  const again = (await pollUntil('billing', (got) => got.some((e) => e.id === 'o-4'))).find((e) => e.id === 'o-4');
  assert.equal(again.emattempt, 2);
  await ack('billing', [again.emdeliveryid], true);
  await waitText('[data-sub="billing"] [data-field="total-lag"]', '0');

  // Each partition's chart went up to what was published there and is back at 0 now.
  for (const [p, events] of stored) {
    const chart = `[data-sub="billing"] tr[data-partition="${p}"] svg.chart`;
    await waitFor(`the lag chart of partition ${p}`, (s) => document.querySelector(s)?.dataset.last === '0', chart);
    assert.equal(await page.$eval(chart, (c) => c.dataset.max), String(events.length), `partition ${p}`);
    assert.ok((await page.$eval(chart, (c) => c.querySelector('polyline').getAttribute('points').split(' ').length)) >= 3);
  }

  await open('dlq');
  await waitFor('the dead letter', () => document.querySelector('#dlq-body tr[data-id="o-4"]') !== null);
  assert.equal(await page.$eval('#dlq-topic', (s) => s.value), 'orders');
  assert.deepEqual(await ids('#dlq-body'), ['o-4']);
  assert.equal(await text('#dlq-body tr[data-id="o-4"] [data-field="reason"]'), 'nack');
  assert.equal(await text('#dlq-body tr[data-id="o-4"] [data-field="attempts"]'), '2');
  await waitText('#dlq-replay', 'Replay 1 to orders');
});

step('a dead letter is replayed from the page, back into its topic', async () => {
  await page.click('#dlq-replay');
  await waitText('#dlq-result', 'replayed 1 to orders');
  // The write says it comes from the console (the broker refuses a Basic write without it).
  assert.deepEqual(writes, [{ method: 'POST', url: `${broker.admin}/admin/dlq/orders/replay`, header: '1' }]);
  await waitFor('the DLQ listing to empty', () => document.querySelectorAll('#dlq-body tr[data-id]').length === 0);
  assert.equal(await page.$eval('#dlq-replay', (b) => b.disabled), true);
  assert.deepEqual((await admin('/admin/dlq/orders')).json, []);

  // Appended to the topic again: the count moves, the subscription lags by it and gets it anew.
  await waitText('tr[data-topic="orders"] [data-field="events"]', '5');
  await waitText('[data-sub="billing"] [data-field="total-lag"]', '1');
  const back = (await pollUntil('billing', (got) => got.some((e) => e.id === 'o-4'))).find((e) => e.id === 'o-4');
  assert.equal(back.emattempt, 1);
  assert.equal(back.emdlqreason, undefined);
  await ack('billing', [back.emdeliveryid]);
  await waitText('[data-sub="billing"] [data-field="total-lag"]', '0');
});

step('the live tail shows only the events its filter matches, as text', async () => {
  await open('tail');
  await waitFor('the topic choice', () => [...document.querySelectorAll('#tail-topic option')].some((o) => o.value === 'orders'));
  await page.select('#tail-topic', 'orders');

  // A filter that does not parse: the broker's reason, and the tail stops.
  await page.type('#tail-filter', 'type =');
  await page.click('#tail-start');
  await waitFor('the parse error', () => document.getElementById('tail-status').dataset.state === 'error');
  assert.match(await text('#tail-status'), /CESQL parse error/);

  await page.$eval('#tail-filter', (i) => (i.value = ''));
  await page.type('#tail-filter', "type = 'com.example.match'");
  await page.click('#tail-start');
  await waitFor('the tail to run', () => document.getElementById('tail-status').dataset.state === 'running');
  assert.equal(await text('#tail-start'), 'Stop');

  // Event contents are the publisher's: markup in them must stay text.
  const markup = '<img src=x id=injected onerror="document.title=\'owned\'">';
  for (const [id, type, key] of [['n-1', 'com.example.other', 'a'], ['m-1', 'com.example.match', 'b'], ['n-2', 'com.example.other', 'c'], ['m-2', 'com.example.match', 'd']]) {
    await publish('orders', { id, type, partitionkey: key, data: { html: markup } });
  }
  await waitFor('both matches', () => document.querySelectorAll('#tail-body tr[data-id]').length >= 2);
  // Two more polls of every partition: anything else the tail would show, it shows by now.
  const polls = Number(await page.$eval('#tail-status', (s) => s.dataset.polls));
  await waitFor('two more polls', (n) => Number(document.getElementById('tail-status').dataset.polls) >= n + 2, polls);
  assert.deepEqual((await ids('#tail-body')).sort(), ['m-1', 'm-2']);
  assert.deepEqual(await page.$$eval('#tail-body tr td:nth-child(4)', (c) => c.map((x) => x.textContent)), ['com.example.match', 'com.example.match']);
  assert.equal(await page.$eval('#tail-body tr[data-id="m-1"] td.data', (c) => c.textContent), JSON.stringify({ html: markup }));
  assert.equal(await page.evaluate(() => document.getElementById('injected')), null);
  assert.notEqual(await page.title(), 'owned');

  await page.click('#tail-start');
  await waitFor('the tail to stop', () => document.getElementById('tail-status').dataset.state === 'idle');
});

step('the live tail runs one loop, however fast it is started and stopped', async () => {
  const partitions = (await admin('/admin/topics')).json.find((t) => t.topic === 'orders').partitions.length;
  assert.equal(partitions, 2);
  await page.$eval('#tail-filter', (i) => (i.value = ''));
  const state = () => page.$eval('#tail-status', (s) => ({ state: s.dataset.state, polls: Number(s.dataset.polls) }));

  // Start submitted twice at once: the second is ignored (Start is disabled while it asks).
  const disabled = await page.evaluate(() => {
    const form = document.getElementById('tail-form');
    form.requestSubmit();
    const d = document.getElementById('tail-start').disabled;
    form.requestSubmit();
    return d;
  });
  assert.equal(disabled, true);
  await waitFor('the tail to poll', () => document.getElementById('tail-status').dataset.state === 'running' && Number(document.getElementById('tail-status').dataset.polls) >= 1);
  assert.equal(await page.$eval('#tail-start', (b) => b.disabled), false);

  // Stop and Start while a poll is in flight: one of its requests is held until the new tail
  // has polled, then answered; the old loop must drop it and end.
  let holding = true;
  let held;
  let seen;
  const inFlight = new Promise((resolve) => (seen = resolve));
  const hold = (r) => {
    if (r.interceptResolutionState().action === 'disabled' || r.isInterceptResolutionHandled()) return;
    if (holding && !held && isTail(r)) {
      held = r;
      seen();
      return;
    }
    r.continue().catch(() => {});
  };
  page.on('request', hold);
  await page.setRequestInterception(true);
  try {
    await inFlight;
    await page.evaluate(() => {
      const form = document.getElementById('tail-form');
      form.requestSubmit(); // Stop
      form.requestSubmit(); // Start
    });
    await waitFor('the new tail to poll', () => document.getElementById('tail-status').dataset.state === 'running' && Number(document.getElementById('tail-status').dataset.polls) >= 1);
    holding = false;
    await held.continue();
  } finally {
    holding = false;
    await page.setRequestInterception(false);
    page.off('request', hold);
  }

  // Events while it runs: each shown once; a datum of 20 000 characters keeps 4 096 in its title.
  const big = 'x'.repeat(20_000);
  const published = ['t-1', 't-2', 't-3', 't-4'];
  for (const [i, id] of published.entries()) await publish('orders', { id, partitionkey: `k${i}`, data: { n: i } });
  await publish('orders', { id: 't-big', data: big });
  await waitFor('the events in the tail', () => document.querySelectorAll('#tail-body tr[data-id]').length >= 5);

  // One loop: every partition asked once a second (at most 4 polls in 3 s), not twice that.
  const asked = [];
  const count = (r) => isTail(r) && asked.push(r.url());
  page.on('request', count);
  const before = await state();
  await sleep(3000);
  page.off('request', count);
  const polled = (await state()).polls - before.polls;
  assert.ok(asked.length <= 4 * partitions && asked.length >= 2 * partitions, `${asked.length} tail requests in 3 s (${polled} polls): ${asked.join(' ')}`);
  assert.ok(asked.length <= (polled + 1) * partitions, `${asked.length} tail requests for ${polled} polls`);

  const shown = await ids('#tail-body');
  assert.deepEqual([...shown].sort(), [...published, 't-big'].sort(), `rows: ${shown.join(' ')}`);
  const title = await page.$eval('#tail-body tr[data-id="t-big"] td.data', (c) => c.title);
  assert.equal(title, `${'x'.repeat(4096)}… (truncated)`);
  assert.equal(await page.$eval('#tail-body tr[data-id="t-big"] td.data', (c) => c.textContent), `${'x'.repeat(160)}…`);

  await page.click('#tail-start');
  await waitFor('the tail to stop', () => document.getElementById('tail-status').dataset.state === 'idle');
  // Stopped means stopped: no poll of the tail after it.
  const late = [];
  const lateCount = (r) => isTail(r) && late.push(r.url());
  page.on('request', lateCount);
  await sleep(1500);
  page.off('request', lateCount);
  assert.deepEqual(late, []);
});

step('a policy is read, created, edited and deleted from the page', async () => {
  await open('policies');
  await waitFor('the ACL tab', () => document.querySelector('#policy-kinds [data-kind="acl"]')?.getAttribute('aria-selected') === 'true');
  const setEditor = (key, body) => page.evaluate((k, b) => {
    document.getElementById('policy-key').value = k;
    document.getElementById('policy-json').value = b;
  }, key, body);

  // The broker's reason for a bad entry, as its problem+json detail says it.
  await setEditor('console-rule', '{"principal": "svc-*"}');
  await page.click('#policy-save');
  await waitFor('the error', () => !document.getElementById('policy-error').hidden);
  assert.match(await text('#policy-error'), /missing field `resource`/);
  assert.equal((await admin('/admin/acl/console-rule')).status, 404);

  const rule = { principal: 'svc-*', resource: 'topic:orders', actions: ['PUBLISH'], effect: 'ALLOW', priority: 10 };
  await setEditor('console-rule', JSON.stringify(rule));
  await page.click('#policy-save');
  await waitText('#policy-message', 'Created console-rule.');
  assert.equal(await page.$eval('#policy-error', (e) => e.hidden), true);
  await waitFor('the new row', () => document.querySelector('#policy-body tr[data-key="console-rule"]') !== null);
  assert.equal((await admin('/admin/acl/console-rule')).json.priority, 10);

  // Edit loads the entry without what the API shows but does not take (`source`).
  await page.click('#policy-body tr[data-key="console-rule"] button');
  assert.equal(await page.$eval('#policy-key', (i) => i.value), 'console-rule');
  const loaded = JSON.parse(await page.$eval('#policy-json', (t) => t.value));
  assert.deepEqual(loaded, rule);
  await setEditor('console-rule', JSON.stringify({ ...loaded, priority: 20 }));
  await page.click('#policy-save');
  await waitText('#policy-message', 'Replaced console-rule.');
  assert.equal((await admin('/admin/acl/console-rule')).json.priority, 20);

  await page.click('#policy-delete');
  await waitText('#policy-message', 'Deleted console-rule.');
  await waitFor('the row to go', () => document.querySelector('#policy-body tr[data-key="console-rule"]') === null);
  assert.equal((await admin('/admin/acl/console-rule')).status, 404);

  // Every write said it comes from the console.
  const policyWrites = writes.filter((w) => w.url.includes('/admin/acl/'));
  assert.deepEqual(policyWrites.map((w) => w.method), ['PUT', 'PUT', 'PUT', 'DELETE']);
  assert.deepEqual(writes.filter((w) => w.header !== '1'), []);
});

step('the cluster view names this instance; agents and sessions are listed', async () => {
  const cluster = (await admin('/admin/cluster')).json;
  await open('cluster');
  await waitFor('this instance', (id) => document.querySelector(`#cluster-body tr[data-instance="${id}"]`) !== null, cluster.instanceId);
  assert.equal(await text('#cluster-summary [data-fact="storage"]'), 'embedded');
  await waitFor('the metrics', () => document.querySelector('#cluster-metrics [data-fact="events published"]') !== null);
  assert.equal(await text('#cluster-metrics [data-fact="dead-lettered"]'), '1');

  await open('agents');
  await waitFor('the agents table', () => document.querySelector('#agents-body tr') !== null);
  assert.match(await text('#agents-body'), /No agents registered/);
  await waitFor('the sessions', () => document.querySelector('#sessions-summary [data-fact="open agent streaming sessions"]') !== null);
});

step('a 429 is waited out, and a credential the broker no longer takes stops the polling', async () => {
  // A broker of its own, whose admin token changes under an open page (a stale tab).
  const before = 'console-test-token-before-7d1e2b';
  const rotated = 'console-test-token-after-0c94fa';
  let other = await startBroker({ args: ['--admin-token', before] });
  const context = await browser.createBrowserContext();
  try {
    const created = await fetch(`${other.admin}/admin/topics/stale`, { method: 'PUT', headers: { authorization: `Bearer ${before}` }, body: '{"partitions":1}' });
    assert.equal(created.status, 201, await created.text());
    const p = await context.newPage();
    await p.authenticate({ username: 'admin', password: before });
    assert.equal((await p.goto(`${other.admin}/console`)).status(), 200);
    const until = async (what, fn) => {
      try {
        await p.waitForFunction(fn, { timeout: WAIT, polling: 100 });
      } catch (e) {
        throw new Error(`waiting for ${what}: ${e.message}; status: ${await p.$eval('#status', (s) => s.textContent)}`);
      }
    };
    await until('a first poll', () => Number(document.documentElement.dataset.polls) >= 1);

    // A 429 with Retry-After: 2 (the broker's answer while it throttles this address): nothing
    // is asked for those 2 s, then the page polls again.
    const times = [];
    let throttledAt;
    const throttle = (r) => {
      if (r.interceptResolutionState().action === 'disabled' || r.isInterceptResolutionHandled()) return;
      if (r.url().includes('/admin/')) {
        if (throttledAt === undefined) {
          throttledAt = Date.now();
          const body = JSON.stringify({ type: 'about:blank', title: 'Too Many Requests', status: 429, detail: 'too many failed authentications from this address; retry later' });
          r.respond({ status: 429, headers: { 'retry-after': '2' }, contentType: 'application/problem+json', body }).catch(() => {});
          return;
        }
        times.push(Date.now());
      }
      r.continue().catch(() => {});
    };
    p.on('request', throttle);
    await p.setRequestInterception(true);
    try {
      await until('the throttled status', () => document.getElementById('status').dataset.state === 'throttled');
      await until('polling again', () => document.getElementById('status').dataset.state === 'live');
    } finally {
      await p.setRequestInterception(false);
      p.off('request', throttle);
    }
    // The poll's other requests went with the throttled one; the next came 2 s later.
    const early = times.filter((t) => t > throttledAt + 300 && t < throttledAt + 1900);
    assert.deepEqual(early.map((t) => t - throttledAt), [], 'asked while told to retry later');
    assert.ok(times.some((t) => t >= throttledAt + 1900), 'polled again after Retry-After');

    // The broker comes back with another token: the page's credential is refused.
    await other.kill();
    other = await startBroker({ dataDir: other.dataDir, trafficPort: other.trafficPort, adminPort: other.adminPort, args: ['--admin-token', rotated] });
    await until('the refusal', () => document.getElementById('status').dataset.state === 'rejected');
    assert.equal(await p.$eval('#status', (s) => s.textContent), 'Credential rejected (401: unknown token): polling stopped; reload the page to sign in again.');

    // Then it asks nothing more: not on its timer, not on a view change, not for a tail.
    const requests = [];
    p.on('request', (r) => requests.push(`${r.method()} ${r.url()}`));
    await p.click('#nav a[data-view="tail"]');
    await p.evaluate(() => document.getElementById('tail-form').requestSubmit());
    await sleep(3000);
    assert.ok(requests.length <= 2, `requests after the 401: ${requests.join(', ')}`);
    assert.equal(await p.$eval('#status', (s) => s.dataset.state), 'rejected');
    assert.equal(await p.$eval('#tail-status', (s) => s.dataset.state), 'error');

    // Nor did it trip the throttle of failed authentications: the new token is taken at once.
    const r = await fetch(`${other.admin}/admin/topics`, { headers: { authorization: `Bearer ${rotated}` } });
    assert.equal(r.status, 200, await r.text());
  } finally {
    await context.close();
    await other.stop();
  }
});

step('the page never broke its own rules, and its picture is taken', async () => {
  assert.deepEqual(pageLog.filter((l) => /pageerror|Content Security Policy|Refused to/.test(l)), []);
  const path = process.env.EVMESH_CONSOLE_SCREENSHOT;
  if (path) {
    await open('subscriptions');
    await page.screenshot({ path, fullPage: true });
  }
});
