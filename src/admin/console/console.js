// The evmesh web console: one page, a client of the admin API and nothing else. It runs on the
// admin listener's origin, so every `fetch('/admin/...')` carries the Basic credential the
// browser was asked for when it opened /console: the page can do nothing an administrator with
// curl cannot.
//
// No framework and no build step: the DOM is built with createElement and textContent only,
// never innerHTML, because what the broker stores (event ids, types, data, subscription names)
// is written by clients and must never be parsed as markup. Charts are small SVG polylines
// drawn here. The page polls every second while the tab is visible, and keeps short
// histories (rates from end-offset deltas, lag per partition) in memory: a reload starts them
// over.
//
// Being a good client of the admin API: every write carries `x-evmesh-console: 1` (the
// broker refuses a Basic-authenticated write without it, so another site cannot make the
// browser write with the stored credential); a 401 stops every poll for good (a stale tab must
// not keep failing authentication: the broker throttles failures per address, which would lock
// out every administrator behind it), a path that answered 403 (what a tenant's administrator
// may not read) is not asked again, and a 429 is waited out as its Retry-After says.
'use strict';

/** Poll period of the admin API and of the live tail. */
const POLL_MS = 1000;
/** Samples kept per history (2 minutes at one a second). */
const HISTORY = 120;
/** Samples a rate is taken over (the last 5 s). */
const RATE_SAMPLES = 6;
/** Rows the live tail keeps (the oldest go). */
const TAIL_ROWS = 200;
/** Events the live tail asks one partition for per poll. */
const TAIL_BATCH = 100;
/** Characters of an event's data shown in a table cell (the cell's title holds more). */
const PREVIEW = 160;
/** Characters of an event's data kept for a row's title: a tail of 200 events of 1 MiB each
 * would otherwise hold 200 MiB in one tab. */
const TITLE_MAX = 4096;
/** What the title of a cut datum ends with. */
const TRUNCATED = '… (truncated)';
/** Wait after a 429 without a usable Retry-After. */
const RETRY_DEFAULT_MS = 5000;

// ---------------------------------------------------------------------------------------------
// DOM helpers

const $ = (id) => document.getElementById(id);

/**
 * An element: `props` are attributes, except `class`, `text` (its textContent) and `on<event>`
 * (a listener); `children` are nodes or strings (strings become text nodes, never markup).
 */
function h(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = String(v);
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c !== undefined && c !== null && c !== false) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

/** Replaces the children of element `id` (an empty list shows `empty` as one wide row). */
function fill(id, rows, empty, columns) {
  const body = $(id);
  if (rows.length === 0 && empty) rows = [h('tr', { class: 'empty' }, h('td', { colspan: columns, text: empty }))];
  body.replaceChildren(...rows);
}

/** A definition list of `[term, value]` pairs into element `id`. */
function facts(id, pairs) {
  $(id).replaceChildren(...pairs.flatMap(([k, v]) => [h('dt', { text: k }), h('dd', { 'data-fact': k, text: v })]));
}

const fmt = (n) => (n === undefined || n === null ? '—' : Number(n).toLocaleString('en-US', { maximumFractionDigits: 1 }));
const ago = (ms) => (ms === undefined || ms === null ? '—' : ms < 1000 ? `${ms} ms ago` : `${(ms / 1000).toFixed(1)} s ago`);

/** An event's data as one short line, and at most TITLE_MAX characters of it (for the title). */
function preview(event) {
  const data = event.data !== undefined ? event.data : event.data_base64 !== undefined ? `base64:${event.data_base64}` : '';
  const whole = (typeof data === 'string' ? data : JSON.stringify(data)) ?? '';
  return [
    whole.length > PREVIEW ? `${whole.slice(0, PREVIEW)}…` : whole,
    whole.length > TITLE_MAX ? `${whole.slice(0, TITLE_MAX)}${TRUNCATED}` : whole,
  ];
}

// ---------------------------------------------------------------------------------------------
// Charts: small SVG line charts, newest sample at the right edge.

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** Samples a chart spans at least: a young history is drawn at this scale, not stretched. */
const CHART_MIN_SAMPLES = 30;

/**
 * A chart of `series` (arrays of numbers, oldest first, at most HISTORY long), scaled to their
 * maximum; one polyline each (colours by position), an area under the first. It spans the
 * longest series (at least CHART_MIN_SAMPLES), so the newest sample is at the right edge.
 * `data-max` and `data-last` say what it shows, for tests and tooltips alike.
 */
function chart(series, label, width = 300, height = 44) {
  const max = Math.max(1, ...series.flat());
  const last = series.map((s) => s[s.length - 1] ?? 0);
  const root = svg('svg', {
    viewBox: `0 0 ${width} ${height}`, width, height, class: 'chart', role: 'img',
    'aria-label': `${label}: now ${last.join(', ')}, max ${max}`, 'data-max': max, 'data-last': last.join(','),
  });
  const pad = 3;
  const step = width / (Math.max(CHART_MIN_SAMPLES, ...series.map((s) => s.length)) - 1);
  const x = (n, j) => width - (n - 1 - j) * step;
  const y = (v) => pad + (height - 2 * pad) * (1 - v / max);
  root.append(svg('line', { x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5, class: 'axis' }));
  series.forEach((s, i) => {
    if (s.length === 0) return;
    const pts = s.map((v, j) => `${x(s.length, j).toFixed(1)},${y(v).toFixed(1)}`);
    if (i === 0 && s.length > 1) {
      root.append(svg('path', { d: `M${x(s.length, 0).toFixed(1)},${height} L${pts.join(' L')} L${width},${height} Z`, class: 'area' }));
    }
    root.append(svg('polyline', { points: pts.join(' '), class: `line c${i % 4}` }));
  });
  const tick = svg('text', { x: 2, y: 10, class: 'tick' });
  tick.textContent = fmt(max);
  root.append(tick);
  return root;
}

// ---------------------------------------------------------------------------------------------
// The admin API

class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }
}

/** The admin API's standing with this page: `rejected`, once it answered 401 (the ApiError;
 * nothing is asked any more: reload to sign in again); `until`, the time (ms) before which no
 * poll asks (a 429's Retry-After); `forbidden`, the paths that answered 403 (not asked again). */
const access = { rejected: undefined, until: 0, forbidden: new Map() };

/** Ms to wait after a 429, from its Retry-After (seconds, or an HTTP date). */
function retryAfter(r) {
  const v = r.headers.get('retry-after');
  const secs = Number(v);
  const ms = v !== null && v.trim() !== '' && Number.isFinite(secs) ? secs * 1000 : Date.parse(v ?? '') - Date.now();
  return Number.isFinite(ms) && ms >= 0 ? Math.min(ms, 3600_000) : RETRY_DEFAULT_MS;
}

/** When the next poll may ask: `ms` from now, or later if a 429 said so. */
const nextPollIn = (ms) => Math.max(ms, access.until - Date.now());

/** A request to this origin; resolves to `{json, headers, status}`, or throws an ApiError with
 * the problem+json `detail`. A write (any method but GET and HEAD) says it comes from this page
 * (`x-evmesh-console: 1`). A 401 ends the page's polling (`reject`); after it, nothing more is
 * sent. A path that answered 403 is not asked again. */
async function api(path, method = 'GET', body) {
  if (access.rejected) throw access.rejected;
  const where = path.split('?')[0];
  if (method === 'GET' && access.forbidden.has(where)) throw access.forbidden.get(where);
  const headers = {};
  if (method !== 'GET' && method !== 'HEAD') headers['x-evmesh-console'] = '1';
  if (body !== undefined) headers['content-type'] = 'application/json';
  const init = { method, cache: 'no-store', credentials: 'same-origin', headers };
  if (body !== undefined) init.body = body;
  const r = await fetch(path, init);
  const text = await r.text();
  let json;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  if (!r.ok) {
    const e = new ApiError(r.status, json?.detail ?? json?.title ?? (text || r.statusText));
    // 401: the credential is refused, everywhere. 403: this credential may not read this
    // (a tenant's administrator and the cluster view): not asked again, the rest goes on.
    if (r.status === 401) reject(e);
    if (r.status === 403 && method === 'GET') access.forbidden.set(where, e);
    if (r.status === 429) {
      e.retryMs = retryAfter(r);
      access.until = Math.max(access.until, Date.now() + e.retryMs);
    }
    throw e;
  }
  return { json, headers: r.headers, status: r.status, text };
}

/** The credential was refused (401): stop the poll and the tail for good and say so. Asking
 * again would only fail again, and count against this address. */
function reject(e) {
  if (access.rejected) return;
  access.rejected = e;
  clearTimeout(timer);
  if (tail.running || tail.starting) stopTail(`Stopped. ${rejection(e)}`, true);
  status(e);
}

/** What the page says once the admin API refused it. */
function rejection(e) {
  return `${e.status === 401 ? 'Credential rejected' : 'Not allowed'} (${e.status}: ${e.detail}): polling stopped; reload the page to sign in again.`;
}

const seg = encodeURIComponent;

/** Sums of the samples of each metric in a Prometheus text (labels summed over). */
function metricSums(text) {
  const sums = new Map();
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m) sums.set(m[1], (sums.get(m[1]) ?? 0) + Number(m[3]));
  }
  return sums;
}

// ---------------------------------------------------------------------------------------------
// State: the last answers, and the histories kept between polls.

const state = {
  view: 'topics',
  topics: [],
  subs: [],
  cluster: undefined,
  /** counter key -> [{t, n}] (ms, running total), for rates. */
  counters: new Map(),
  /** series key -> numbers, oldest first. */
  series: new Map(),
  /** Keys sampled in the current poll: the others (deleted topics, subscriptions) are dropped. */
  touched: new Set(),
};

function push(map, key, v) {
  state.touched.add(key);
  let a = map.get(key);
  if (!a) map.set(key, (a = []));
  a.push(v);
  if (a.length > HISTORY) a.shift();
  return a;
}

/** Records running total `n` of counter `key`; returns its rate per second over the last samples. */
function rate(key, n, t) {
  const a = push(state.counters, key, { t, n });
  const first = a[Math.max(0, a.length - RATE_SAMPLES)];
  const last = a[a.length - 1];
  // A total going down (the broker restarted on memory durability) is no negative rate.
  return last.t > first.t ? Math.max(0, (last.n - first.n) * 1000) / (last.t - first.t) : 0;
}

function forget() {
  for (const map of [state.counters, state.series]) for (const k of map.keys()) if (!state.touched.has(k)) map.delete(k);
  state.touched.clear();
}

// ---------------------------------------------------------------------------------------------
// Topics

function sampleTopics(topics, t) {
  for (const topic of topics) {
    const total = topic.partitions.reduce((s, p) => s + p.end_offset, 0);
    topic.rate = rate(`topic:${topic.topic}`, total, t);
    push(state.series, `rate:${topic.topic}`, Math.round(topic.rate * 10) / 10);
    for (const p of topic.partitions) p.rate = rate(`part:${topic.topic}#${p.partition}`, p.end_offset, t);
  }
}

function renderTopics() {
  const rows = state.topics.map((topic) => {
    const total = topic.partitions.reduce((s, p) => s + p.end_offset, 0);
    const retained = topic.partitions.reduce((s, p) => s + p.end_offset - p.start_offset, 0);
    const parts = topic.partitions.map((p) =>
      h('span', { class: 'chip', title: `partition ${p.partition}: offsets ${p.start_offset}..${p.end_offset}, ${fmt(p.rate)} events/s`, 'data-partition': p.partition },
        `p${p.partition} `, h('b', { text: fmt(p.end_offset) })));
    return h('tr', { 'data-topic': topic.topic },
      h('td', {}, h('span', { class: 'name', text: topic.topic }), topic.topic.endsWith('.dlq') ? h('span', { class: 'badge warn', text: 'DLQ' }) : null),
      h('td', {}, h('div', { class: 'chips' }, parts)),
      h('td', { class: 'num', 'data-field': 'events', text: total }),
      h('td', { class: 'num', 'data-field': 'retained', text: retained }),
      h('td', { class: 'num', 'data-field': 'rate', text: fmt(topic.rate) }),
      h('td', {}, chart([state.series.get(`rate:${topic.topic}`) ?? []], `${topic.topic} events/s`)));
  });
  fill('topics-body', rows, 'No topics yet: one is created by its first publish (or PUT /admin/topics/{topic}).', 6);
}

// ---------------------------------------------------------------------------------------------
// Subscriptions: lag per partition and consumer, with its history.

function sampleSubs(subs) {
  for (const s of subs) {
    for (const p of s.partitions) {
      for (const c of p.consumers) push(state.series, `lag:${s.subscription}#${p.partition}#${c.client ?? ''}`, c.lag);
    }
  }
}

/** Where a subscription's sessions attach: the listing's home, else (none known live yet) the
 * only instance. */
function homeOf(s) {
  if (s.home) return `${s.home.instanceId} (${s.home.url})`;
  const live = state.cluster?.instances ?? [];
  return live.length === 1 ? `${live[0].instanceId} (${live[0].advertisedUrl})` : '—';
}

function renderSubs() {
  const cards = state.subs.map((s) => {
    const lags = s.partitions.flatMap((p) => p.consumers.map((c) => c.lag));
    const total = s.partitions.reduce((sum, p) => sum + Math.max(0, ...p.consumers.map((c) => c.lag)), 0);
    const rows = s.partitions.map((p) => {
      const worst = p.consumers.length ? Math.max(...p.consumers.map((c) => c.lag)) : undefined;
      const who = p.consumers.map((c) =>
        h('li', { 'data-client': c.client ?? '' }, h('span', { class: 'name', text: c.client ?? 'shared' }),
          ` committed ${fmt(c.committed)}, lag `, h('b', { text: fmt(c.lag) })));
      const series = p.consumers.map((c) => state.series.get(`lag:${s.subscription}#${p.partition}#${c.client ?? ''}`) ?? []);
      return h('tr', { 'data-partition': p.partition },
        h('td', { text: p.partition }),
        h('td', { class: 'num', text: fmt(p.end_offset) }),
        h('td', {}, who.length ? h('ul', { class: 'consumers' }, who) : h('span', { class: 'muted', text: 'not read yet' })),
        h('td', { class: 'num', 'data-field': 'lag', text: worst === undefined ? '—' : worst }),
        h('td', {}, series.length ? chart(series, `lag of ${s.subscription} partition ${p.partition}`) : null));
    });
    const meta = [
      ['topic', s.topic], ['mode', s.mode], ['start', typeof s.start === 'string' ? s.start : JSON.stringify(s.start)],
      ['filters', s.filters?.length ? JSON.stringify(s.filters) : 'none'], ['maxAttempts', s.maxAttempts],
      ['ackTimeoutMs', s.ackTimeoutMs], ['sink', s.sink], ['home', homeOf(s)],
    ].filter(([, v]) => v !== undefined && v !== null);
    return h('article', { class: 'card', 'data-sub': s.subscription },
      h('header', {},
        h('h3', { text: s.subscription }),
        h('span', { class: 'badge', text: s.mode ?? '' }),
        h('span', { class: 'lagsum' }, 'lag ', h('b', { 'data-field': 'total-lag', text: total }))),
      h('dl', { class: 'facts inline' }, meta.flatMap(([k, v]) => [h('dt', { text: k }), h('dd', { 'data-fact': k, text: v })])),
      h('table', { class: 'grid' },
        h('thead', {}, h('tr', {}, ['Partition', 'End', 'Consumers', 'Lag', 'Lag history'].map((c, i) => h('th', { class: i === 1 || i === 3 ? 'num' : null, text: c })))),
        h('tbody', {}, rows)),
      lags.length === 0 ? h('p', { class: 'hint', text: 'No session has read it yet: lag shows once one has.' }) : null);
  });
  if (cards.length === 0) cards.push(h('p', { class: 'muted', text: 'No subscriptions (POST /events/subscribe on the traffic listener).' }));
  $('subs-list').replaceChildren(...cards);
}

// ---------------------------------------------------------------------------------------------
// Dead letters

/** Keeps a select's options equal to `names`, and its choice if still offered. */
function options(select, names, none) {
  const chosen = select.value;
  const same = select.options.length === names.length && names.every((n, i) => select.options[i].value === n);
  if (!same) {
    select.replaceChildren(...(names.length ? names.map((n) => h('option', { value: n, text: n })) : [h('option', { value: '', text: none })]));
    if (names.includes(chosen)) select.value = chosen;
  }
}

async function refreshDlq() {
  const names = new Set(state.topics.map((t) => t.topic));
  options($('dlq-topic'), [...names].filter((n) => names.has(`${n}.dlq`)), '(no dead letters yet)');
  const topic = $('dlq-topic').value;
  const letters = topic ? (await api(`/admin/dlq/${seg(topic)}`)).json : [];
  const rows = letters.map(({ partition, offset, event: e }) => {
    const [short, whole] = preview(e);
    return h('tr', { 'data-id': e.id },
      h('td', { text: `${partition}/${offset}` }),
      h('td', { class: 'name', text: e.id }),
      h('td', { text: e.type }),
      h('td', { text: e.emdlqsubscription ?? '—' }),
      h('td', {}, h('span', { class: 'badge warn', 'data-field': 'reason', text: e.emdlqreason ?? '—' })),
      h('td', { class: 'num', 'data-field': 'attempts', text: e.emdlqattempts ?? '—' }),
      h('td', { text: `${e.emdlqpartition ?? '?'}/${e.emdlqoffset ?? '?'}` }),
      h('td', { class: 'data', title: whole, text: short }));
  });
  fill('dlq-body', rows, topic ? `No dead letters of ${topic} waiting.` : 'No topic has dead letters.', 8);
  $('dlq-replay').disabled = letters.length === 0;
  $('dlq-replay').textContent = letters.length ? `Replay ${letters.length} to ${topic}` : 'Replay all';
}

async function replay() {
  const topic = $('dlq-topic').value;
  const out = $('dlq-result');
  $('dlq-replay').disabled = true;
  try {
    const { json } = await api(`/admin/dlq/${seg(topic)}/replay`, 'POST');
    out.className = 'note ok';
    out.textContent = `replayed ${json.replayed} to ${json.topic}`;
  } catch (e) {
    out.className = 'note error';
    out.textContent = e.detail ?? String(e);
  }
  await refreshDlq().catch(() => {});
}

// ---------------------------------------------------------------------------------------------
// Cluster, agents and sessions

function renderCluster() {
  const c = state.cluster;
  if (!c) return;
  facts('cluster-summary', [['this instance', c.instanceId], ['storage', c.storage], ['claims read', c.claimsRead ? 'yes' : 'not yet'],
    ['instance timeout', `${c.instanceTimeoutMs} ms`], ['live instances', c.instances.length]]);
  fill('cluster-body', c.instances.map((i) => h('tr', { 'data-instance': i.instanceId, class: i.self ? 'self' : null },
    h('td', {}, h('span', { class: 'name', text: i.instanceId }), i.self ? h('span', { class: 'badge', text: 'this one' }) : null),
    h('td', { text: i.advertisedUrl }),
    h('td', { class: 'num', text: fmt(i.sessions) }),
    h('td', { class: 'num', text: fmt(i.bytesPerSecond) }),
    h('td', { class: 'num', text: fmt(i.cpuPercent) }),
    h('td', { class: 'num', text: ago(i.lastHeartbeatMs) }))), 'No live instance.', 6);
}

async function refreshMetrics() {
  const m = metricSums((await api('/metrics')).text);
  const mib = (b) => `${fmt((b ?? 0) / 1048576)} MiB`;
  facts('cluster-metrics', [
    ['events published', fmt(m.get('evmesh_events_published_total'))], ['deliveries', fmt(m.get('evmesh_deliveries_total'))],
    ['redeliveries', fmt(m.get('evmesh_redeliveries_total'))], ['dead-lettered', fmt(m.get('evmesh_dead_lettered_total'))],
    ['open connections', fmt(m.get('evmesh_connections_open'))], ['resident memory', mib(m.get('evmesh_memory_resident_bytes'))],
    ['memory limit', mib(m.get('evmesh_memory_limit_bytes'))], ['mailbox depth', fmt(m.get('evmesh_mailbox_depth'))]]);
  facts('sessions-summary', [
    ['open agent streaming sessions', fmt(m.get('evmesh_stream_sessions'))], ['chunks streamed', fmt(m.get('evmesh_stream_chunks_total'))],
    ['chunks dropped', fmt(m.get('evmesh_stream_chunks_dropped_total'))], ['sessions expired', fmt(m.get('evmesh_stream_sessions_expired_total'))],
    ['subscription sessions, all instances', fmt((state.cluster?.instances ?? []).reduce((s, i) => s + (i.sessions ?? 0), 0))]]);
}

async function refreshAgents() {
  const agents = (await api('/admin/agents')).json;
  fill('agents-body', agents.map((a) => h('tr', { 'data-agent': a.agentId },
    h('td', { class: 'name', text: a.agentId }),
    h('td', {}, h('span', { class: `badge ${a.ready ? 'ok' : 'warn'}`, text: a.ready ? 'ready' : 'not ready' })),
    h('td', {}, h('span', { class: `badge ${a.routable ? 'ok' : 'warn'}`, text: a.routable ? 'yes' : 'no' })),
    h('td', { class: 'num', text: a.lastHeartbeatMs ? ago(Date.now() - a.lastHeartbeatMs) : '—' }))),
  'No agents registered (agents attach at /agent/ws on the traffic listener).', 4);
}

// ---------------------------------------------------------------------------------------------
// Policies: list each kind, edit one entry as JSON.

/** The policy kinds: the field an entry's key shows under, the fields shown but not part of a
 * PUT body (`readOnly`), and a starting entry for "New". */
const POLICIES = {
  acl: { title: 'ACL rules', key: 'id', readOnly: ['source'], example: { principal: 'svc-*', resource: 'topic:orders.*', actions: ['PUBLISH'], effect: 'ALLOW', priority: 10 } },
  limits: { title: 'Rate limits', key: 'id', example: { scope: 'topic:orders', eventsPerSecond: 1000, bytesPerSecond: 1048576, burst: 200 } },
  quotas: { title: 'Quotas', key: 'tenant', example: { connections: 100, topics: 10, subscriptions: 10, backlogBytes: 1073741824 } },
  transformers: { title: 'Transformers', key: 'topic', example: { set: { env: 'prod' }, remove: [], rename: {} } },
  routes: { title: 'Routes', key: 'id', example: { topic: 'orders', condition: "type = 'com.shop.refund'", targets: ['refunds'], mode: 'copy' } },
};
const policy = { kind: 'acl', entries: [] };

function policyTabs() {
  $('policy-kinds').replaceChildren(...Object.entries(POLICIES).map(([kind, p]) =>
    h('button', { type: 'button', role: 'tab', 'data-kind': kind, 'aria-selected': String(kind === policy.kind), text: p.title,
      onclick: () => { policy.kind = kind; policyTabs(); edit(undefined); refreshPolicies().catch(status); } })));
  $('policy-key-head').textContent = POLICIES[policy.kind].key;
}

async function refreshPolicies() {
  const kind = policy.kind;
  const entries = (await api(`/admin/${kind}`)).json;
  if (kind !== policy.kind) return; // the tab changed while asking
  policy.entries = entries;
  const field = POLICIES[kind].key;
  fill('policy-body', entries.map((e) => {
    const { [field]: key, ...rest } = e;
    // Rules from the config file are shown, not edited here (the API answers 409).
    const locked = rest.source === 'config';
    return h('tr', { 'data-key': key },
      h('td', {}, h('span', { class: 'name', text: key }), locked ? h('span', { class: 'badge warn', text: 'config file' }) : null),
      h('td', { class: 'data', text: JSON.stringify(rest) }),
      h('td', {}, h('button', { type: 'button', class: 'small', text: 'Edit', onclick: () => edit(e) })));
  }), `No ${POLICIES[kind].title.toLowerCase()}.`, 3);
}

/** Puts `entry` (undefined: a new one, from the example) in the editor. */
function edit(entry) {
  const p = POLICIES[policy.kind];
  const { [p.key]: key, ...rest } = entry ?? { ...p.example };
  for (const f of p.readOnly ?? []) delete rest[f];
  $('policy-title').textContent = entry ? `Edit ${p.key} ${key}` : `New entry of ${p.title.toLowerCase()}`;
  $('policy-key').value = key ?? '';
  $('policy-json').value = JSON.stringify(rest, null, 2);
  $('policy-delete').disabled = !entry;
  say('', '');
}

/** The editor's outcome: `text` as a note, or as the error (`problem+json` detail). */
function say(note, error) {
  $('policy-message').textContent = note;
  $('policy-error').textContent = error;
  $('policy-error').hidden = !error;
}

async function savePolicy(ev) {
  ev.preventDefault();
  const key = $('policy-key').value.trim();
  const text = $('policy-json').value;
  if (!key) return say('', 'A key is needed.');
  try {
    JSON.parse(text);
  } catch (e) {
    return say('', `Not JSON: ${e.message}`);
  }
  try {
    const r = await api(`/admin/${policy.kind}/${seg(key)}`, 'PUT', text);
    say(r.status === 201 ? `Created ${key}.` : `Replaced ${key}.`, '');
    $('policy-delete').disabled = false;
  } catch (e) {
    say('', e.detail ?? String(e));
  }
  await refreshPolicies().catch(status);
}

async function deletePolicy() {
  const key = $('policy-key').value.trim();
  try {
    await api(`/admin/${policy.kind}/${seg(key)}`, 'DELETE');
    edit(undefined);
    say(`Deleted ${key}.`, '');
  } catch (e) {
    say('', e.detail ?? String(e));
  }
  await refreshPolicies().catch(status);
}

// ---------------------------------------------------------------------------------------------
// Live tail: each partition from its end at start, through the CESQL filter, newest first.
//
// One loop at a time: `gen` counts the starts and stops, and a loop (or a start still asking
// for the topic) that finds another generation current after an await drops what it got and
// ends, so a Stop and Start while a poll is in flight cannot leave the old loop running,
// writing into the new tail's offsets and rows. Start is disabled while it asks.

const tail = { running: false, starting: false, gen: 0, topic: '', filter: '', next: new Map(), rows: [], polls: 0, timer: undefined };

function tailState(s, text) {
  const el = $('tail-status');
  el.dataset.state = s;
  el.dataset.polls = String(tail.polls);
  el.className = `note ${s === 'error' ? 'error' : ''}`;
  el.textContent = text;
  $('tail-start').textContent = tail.running ? 'Stop' : 'Start';
  $('tail-start').disabled = tail.starting;
}

const tailWhat = () => `${tail.topic}${tail.filter ? ` where ${tail.filter}` : ''}`;
const tailOffsets = () => [...tail.next].map(([p, o]) => `p${p}@${o}`).join(' ');

async function startTail(ev) {
  ev.preventDefault();
  if (tail.starting) return; // a second submit while the first still asks for the topic
  if (tail.running) return stopTail('Stopped.');
  const topic = $('tail-topic').value;
  const filter = $('tail-filter').value.trim();
  if (!topic) return tailState('error', 'Pick a topic.');
  const gen = ++tail.gen;
  tail.starting = true;
  tailState('starting', `Starting the tail of ${topic}…`);
  let t;
  try {
    t = ((await api('/admin/topics')).json ?? []).find((x) => x.topic === topic);
  } catch (e) {
    if (gen !== tail.gen) return;
    tail.starting = false;
    return tailState('error', `Not started: ${e.detail ?? e}`);
  }
  if (gen !== tail.gen) return; // stopped (or started anew) meanwhile
  tail.starting = false;
  if (!t) return tailState('error', `No topic ${topic}.`);
  Object.assign(tail, { running: true, topic, filter, rows: [], polls: 0 });
  tail.next = new Map(t.partitions.map((p) => [p.partition, p.end_offset]));
  $('tail-body').replaceChildren();
  tailState('running', `Tailing ${tailWhat()}, from offsets ${tailOffsets()}.`);
  tailPoll(gen);
}

function stopTail(why, error) {
  tail.gen++;
  tail.running = false;
  tail.starting = false;
  clearTimeout(tail.timer);
  tailState(error ? 'error' : 'idle', why);
}

/** A row of the tail: what its cells show, not the event (whose data may be a MiB). */
function tailRow(partition, { offset, event: e }) {
  const [short, title] = preview(e);
  return { partition, offset, id: e.id, type: e.type, source: e.source, time: e.time, short, title };
}

/**
 * One poll of every partition of the tail of generation `gen`, then the next one POLL_MS later
 * (later still if a 429 said so), whatever the answers: each partition goes on from its
 * `evmesh-next-offset`, also when the broker's CESQL budget ran out before the page was read
 * through (`evmesh-filter-exhausted`), and a poll that got nothing and moved no offset is not
 * repeated any sooner, so the tail never spins.
 */
async function tailPoll(gen) {
  if (gen !== tail.gen || !tail.running) return;
  if (!document.hidden && Date.now() >= access.until) {
    // Partitions added since the start are followed from their first event.
    for (const p of state.topics.find((x) => x.topic === tail.topic)?.partitions ?? []) if (!tail.next.has(p.partition)) tail.next.set(p.partition, 0);
    const filter = tail.filter ? `&filter=${seg(tail.filter)}` : '';
    const asked = [...tail.next].map(async ([p, from]) => {
      const r = await api(`/admin/topics/${seg(tail.topic)}/partitions/${p}/events?from=${from}&max=${TAIL_BATCH}${filter}`);
      const header = r.headers.get('evmesh-next-offset');
      const next = header === null ? NaN : Number(header);
      const events = r.json ?? [];
      // Never backwards: an event is shown once.
      return { p, next: Number.isFinite(next) ? Math.max(next, from) : from + events.length, events };
    });
    try {
      const answers = await Promise.all(asked);
      if (gen !== tail.gen) return; // stopped or started anew while asking: not this tail's
      tail.polls++;
      const got = [];
      for (const { p, next, events } of answers) {
        tail.next.set(p, next);
        for (const x of events) got.push([p, x]);
      }
      if (got.length) {
        // Newest first; only what is kept is made into rows.
        const fresh = got.slice(-TAIL_ROWS).reverse().map(([p, x]) => tailRow(p, x));
        tail.rows = fresh.concat(tail.rows).slice(0, TAIL_ROWS);
        renderTail();
      }
      tailState('running', `Tailing ${tailWhat()}: ${tail.rows.length} shown, next ${tailOffsets()}.`);
    } catch (e) {
      if (gen !== tail.gen) return;
      if (e.status !== 429) return stopTail(`Stopped: ${e.detail ?? e}`, true);
      tailState('running', `Tailing ${tailWhat()}: throttled (429), next poll in ${Math.ceil(nextPollIn(0) / 1000)} s.`);
    }
  }
  if (gen !== tail.gen || !tail.running) return;
  tail.timer = setTimeout(() => tailPoll(gen), nextPollIn(POLL_MS));
}

function renderTail() {
  $('tail-body').replaceChildren(...tail.rows.map((r) =>
    h('tr', { 'data-id': r.id },
      h('td', { text: r.time ?? '—' }),
      h('td', { text: `${r.partition}/${r.offset}` }),
      h('td', { class: 'name', text: r.id }),
      h('td', { text: r.type }),
      h('td', { text: r.source }),
      h('td', { class: 'data', title: r.title, text: r.short }))));
}

// ---------------------------------------------------------------------------------------------
// Navigation, the poll loop, the status line

const VIEWS = ['topics', 'subscriptions', 'dlq', 'cluster', 'agents', 'policies', 'tail'];

function show() {
  const v = location.hash.slice(1);
  state.view = VIEWS.includes(v) ? v : 'topics';
  for (const name of VIEWS) $(`view-${name}`).hidden = name !== state.view;
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.view === state.view);
  if (state.view === 'tail') options($('tail-topic'), state.topics.map((t) => t.topic), '(no topics yet)');
  poll();
}

/** The status line: live and when, or the error that stopped the last poll; once the admin
 * API refused the credential, that, whatever else happens. `data-state` says which. */
function status(e) {
  const el = $('status');
  const set = (s, className, text) => {
    el.dataset.state = s;
    el.className = `status ${className}`;
    el.textContent = text;
  };
  if (access.rejected) set('rejected', 'error', rejection(access.rejected));
  else if (e?.status === 429) set('throttled', 'error', `Throttled by the admin API (429): next poll in ${Math.ceil(nextPollIn(0) / 1000)} s`);
  else if (e) set('error', 'error', `Admin API: ${e.detail ?? e.message ?? e}`);
  else if (document.hidden) set('paused', 'paused', 'Paused (tab hidden)');
  else set('live', 'ok', `Live · ${new Date().toLocaleTimeString()}`);
}

let timer;
let polling = false;

/** One poll: topics, subscriptions and the cluster always (their histories must not gap),
 * what the shown section needs besides. Then the next POLL_MS later (or once a 429's
 * Retry-After has passed), unless the tab is hidden or the credential was refused. */
async function poll() {
  clearTimeout(timer);
  if (polling || access.rejected) return;
  if (Date.now() < access.until) {
    // Throttled: a view change or the tab coming back does not ask before the broker said.
    if (!document.hidden) timer = setTimeout(poll, nextPollIn(0));
    return;
  }
  polling = true;
  try {
    if (!document.hidden) {
      const [topics, subs, cluster] = await Promise.all([api('/admin/topics'), api('/admin/subscriptions'), api('/admin/cluster')]);
      const t = Date.now();
      state.topics = topics.json.sort((a, b) => a.topic.localeCompare(b.topic));
      state.subs = subs.json.sort((a, b) => a.subscription.localeCompare(b.subscription));
      state.cluster = cluster.json;
      sampleTopics(state.topics, t);
      sampleSubs(state.subs);
      forget();
      $('instance').textContent = `${cluster.json.instanceId} · ${cluster.json.storage}`;
      renderTopics();
      renderSubs();
      renderCluster();
      if (state.view === 'dlq') await refreshDlq();
      if (state.view === 'cluster' || state.view === 'agents') await refreshMetrics();
      if (state.view === 'agents') await refreshAgents();
      if (state.view === 'policies') await refreshPolicies();
      if (state.view === 'tail') options($('tail-topic'), state.topics.map((x) => x.topic), '(no topics yet)');
      document.documentElement.dataset.polls = String(Number(document.documentElement.dataset.polls ?? 0) + 1);
    }
    status();
  } catch (e) {
    status(e);
  } finally {
    polling = false;
    if (!document.hidden && !access.rejected) timer = setTimeout(poll, nextPollIn(POLL_MS));
  }
}

function start() {
  $('dlq-topic').addEventListener('change', () => refreshDlq().catch(status));
  $('dlq-replay').addEventListener('click', replay);
  $('policy-form').addEventListener('submit', savePolicy);
  $('policy-delete').addEventListener('click', deletePolicy);
  $('policy-new').addEventListener('click', () => edit(undefined));
  $('tail-form').addEventListener('submit', startTail);
  $('dlq-form').addEventListener('submit', (ev) => ev.preventDefault());
  window.addEventListener('hashchange', show);
  document.addEventListener('visibilitychange', () => (document.hidden ? status() : poll()));
  policyTabs();
  edit(undefined);
  document.documentElement.dataset.console = 'ready';
  show();
}

start();
