// Test support (not a test file): a real evmesh broker per test file, the WebSocket to give
// the client on Node 20, and small helpers that await conditions instead of sleeping.
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

export const BIN = process.env.EVMESH_BIN || '/var/tmp/evmesh-helper-bin/evmesh';

/**
 * The WebSocket constructor the tests give the client: the platform's (Node 22+), else the
 * `ws` package (a test-only dependency, from NODE_PATH or the test suite's node dir).
 */
export const WebSocketImpl = globalThis.WebSocket ?? loadWs();

function loadWs() {
  const require = createRequire(import.meta.url);
  const dirs = [...(process.env.NODE_PATH ?? '').split(':').filter(Boolean), '/var/tmp/evmesh-node/node_modules'];
  for (const d of dirs) {
    try {
      return require(join(d, 'ws'));
    } catch {
      // next
    }
  }
  throw new Error(`no WebSocket: Node ${process.version} has no global WebSocket and the ws package is not in ${dirs.join(', ')}`);
}

/**
 * Starts `evmesh serve` (2 shards) and resolves once its admin listener says ready. Ports and the
 * data dir may be given to restart a broker where it was.
 */
export async function startBroker({ dataDir, trafficPort = 0, adminPort = 0, durability, env = {}, args = [] } = {}) {
  dataDir ??= await mkdtemp(join(tmpdir(), 'evmesh-js-'));
  const argv = ['serve', '--listen', `127.0.0.1:${trafficPort}`, '--admin-listen', `127.0.0.1:${adminPort}`, '--data-dir', dataDir, '--shards', '2'];
  if (durability) argv.push('--durability', durability);
  argv.push(...args);
  const proc = spawn(BIN, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let stderr = '';
  proc.stderr.on('data', (b) => {
    stderr = (stderr + b.toString()).slice(-8192);
  });
  const exited = new Promise((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));
  const lines = createInterface({ input: proc.stdout });
  const first = await Promise.race([
    new Promise((resolve) => lines.once('line', resolve)),
    exited.then(({ code, signal }) => {
      throw new Error(`evmesh exited (${code ?? signal}) before listening: ${stderr}`);
    }),
  ]);
  lines.on('line', () => {});
  const m = /traffic=127\.0\.0\.1:(\d+) admin=127\.0\.0\.1:(\d+)/.exec(first);
  if (!m) throw new Error(`unexpected first line from evmesh: ${first}`);
  const broker = {
    proc,
    exited,
    dataDir,
    trafficPort: Number(m[1]),
    adminPort: Number(m[2]),
    url: `http://127.0.0.1:${m[1]}`,
    admin: `http://127.0.0.1:${m[2]}`,
    stderr: () => stderr,
    /** SIGKILL, and wait for the exit. */
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
    },
    /** Stops the broker and removes its data dir. */
    async stop() {
      await broker.kill();
      await rm(dataDir, { recursive: true, force: true });
    },
  };
  await until(async () => (await fetch(`${broker.admin}/readyz`).catch(() => undefined))?.status === 200, 'broker ready', exited);
  return broker;
}

/**
 * Resolves once `cond()` is true, checking again after each short pause (for conditions only
 * the broker knows); rejects if `abort` (a promise) settles first.
 */
export async function until(cond, what = 'condition', abort) {
  let aborted;
  abort?.then((v) => (aborted = v ?? true));
  for (let i = 0; ; i++) {
    if (await cond()) return;
    if (aborted) throw new Error(`gave up waiting for ${what}: ${JSON.stringify(aborted)}`);
    await new Promise((r) => setTimeout(r, Math.min(100, 5 * (i + 1))));
  }
}

/** Resolves with the first state of `x` (a consumer, agent or session subscriber) that is of `kind`. */
export function stateReached(x, kind) {
  return new Promise((resolve) => {
    if (x.state.kind === kind) return resolve(x.state);
    const off = x.onState((s) => {
      if (s.kind === kind) {
        off();
        resolve(s);
      }
    });
  });
}

/** Every partition of every consumer of subscription `name` has lag 0 (all acknowledged). */
export async function drained(admin, name) {
  const subs = await (await fetch(`${admin}/admin/subscriptions`)).json();
  const s = subs.find((x) => x.subscription === name);
  return s !== undefined && s.partitions.every((p) => p.consumers.length > 0 && p.consumers.every((c) => c.lag === 0));
}

/** A CloudEvent with id `id`. */
export function event(id, extra = {}) {
  return { specversion: '1.0', id, source: '/evmesh-js-test', type: 'com.example.test', data: { n: id }, ...extra };
}
