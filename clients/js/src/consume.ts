/**
 * Consuming a subscription: a {@link Consumer} is an async iterable of {@link Delivery}s that
 * keeps itself attached. It asks `GET /session/recommend` where the subscription's home is,
 * attaches there over the chosen transport with its credit window on the attach URL, sends acks
 * and nacks back in batches, and when the session ends reconnects with full-jitter backoff (at
 * once after a `1012` "home moved", or an expired token, refreshed first). Offsets are the
 * broker's: a consumer that comes back resumes after what it acknowledged, and gets again what
 * it had been given but not acknowledged (at most its window per shard).
 * @module
 */

import { backoffDelay, sleep } from "./backoff.js";
import { link, type Conn } from "./conn.js";
import { EvmeshError, asEvmeshError } from "./errors.js";
import { asCloudEvent, extension, short, type CloudEvent } from "./event.js";
import { Feed } from "./feed.js";
import type { ConnectionState } from "./queue.js";
import { SseParser } from "./sse.js";
import type { Filter } from "./subscription.js";
import type { WsConn } from "./ws.js";

/** How a consumer's deliveries reach it. */
export type Transport =
  /** `GET /events/ws`: acks, nacks and credit on the socket (the default). */
  | "websocket"
  /** `GET /events/sse`: acks over `POST /events/ack`; resumes with `Last-Event-ID`. */
  | "sse"
  /** `GET /events/poll` in a loop: acks over `POST /events/ack`. */
  | "longpoll";

/** Options of {@link Client.consumer}. */
export interface ConsumerOptions {
  /** The client id of a BROADCAST or MULTICAST consumer, under which its offsets are kept. */
  clientId?: string;
  /** The transport (default `websocket`). */
  transport?: Transport;
  /**
   * How many unacknowledged deliveries the broker may have out to this consumer, per shard
   * owning its partitions (default 256, 1..4096), set with the attach (`&credit=N`) on
   * WebSocket and SSE; on long-poll it is the batch size (at most 1000).
   */
  window?: number;
  /** Live fan-out without acknowledgements (`ack=none`; BROADCAST, WebSocket only): at-most-once, from the moment of attaching. */
  noAck?: boolean;
  /** How long one long-poll waits for events (default 10000, at most 60000). */
  pollWaitMs?: number;
  /** A MULTICAST session's own CESQL filter. */
  sql?: string;
  /** A MULTICAST session's own Subscriptions API filters. */
  filters?: Filter[];
  /**
   * Told of deliveries this client could not read (not JSON, not a CloudEvent, no
   * `emdeliveryid`): they are skipped (and nacked when they have a delivery id, so they end
   * dead-lettered rather than lost), and the iteration goes on.
   */
  onError?: (error: EvmeshError) => void;
}

/**
 * One event given to a consumer. Acknowledge it with {@link ack} once it is handled; what is
 * not acknowledged within the subscription's `ackTimeoutMs` (or is nacked) is delivered again.
 * Deliveries are at least once: dedupe on the event's `id` where it matters.
 */
export class Delivery {
  private settled = false;

  /** @internal */
  constructor(
    /** The event, with the broker's `em*` extensions. */
    readonly event: CloudEvent,
    /** The delivery id (`emdeliveryid`), what acks name. */
    readonly id: string,
    /** The partition the event is stored in (`empartition`). */
    readonly partition: number,
    /** Its offset there (`emoffset`). */
    readonly offset: number,
    /** Which delivery of the event this is, 1 for the first (`emattempt`). */
    readonly attempt: number,
    private readonly settle: (nack: boolean) => void,
  ) {}

  /**
   * Acknowledges the event: it will not be delivered again. Acks are sent in batches, right
   * away; one that cannot be sent (the session ended first) means the event comes again.
   * Only the first `ack` or `nack` of a delivery counts.
   */
  ack(): void {
    if (this.settled) return;
    this.settled = true;
    this.settle(false);
  }

  /** Refuses the event: it is delivered again after the redelivery backoff (and dead-lettered once its attempts are spent). */
  nack(): void {
    if (this.settled) return;
    this.settled = true;
    this.settle(true);
  }
}

/** An ack or nack waiting to be sent. */
interface AckMsg {
  generation: number;
  id: string;
  nack: boolean;
}

/** The acks and nacks waiting, split into this session's and older ones. */
interface Settled {
  acks: string[];
  nacks: string[];
  staleAcks: string[];
  staleNacks: string[];
}

/** How a session ended. */
type End =
  | { type: "stopped" }
  | { type: "fatal"; error: EvmeshError }
  | { type: "retry"; reason: string; immediate: boolean; afterMs: number | undefined; attached: boolean };

const STOPPED: End = { type: "stopped" };

/** Attempts in a row that must meet a 404 before a consumer gives up on its subscription. */
const UNKNOWN_TRIES = 3;

/** Try again (after the backoff). */
function retry(reason: string, attached: boolean): End {
  return { type: "retry", reason, immediate: false, afterMs: undefined, attached };
}

/**
 * An attach the broker refused or that failed: for good (400, 401 after a refresh, 403, 404,
 * 409...) or for now (429, 503: after `Retry-After`; a connection failure).
 */
function refused(e: unknown): End {
  const err = asEvmeshError(e, "http", "attach");
  if (err.transient) return { type: "retry", reason: err.message, immediate: false, afterMs: err.retryAfterMs, attached: false };
  return { type: "fatal", error: err };
}

/**
 * A stream of deliveries of one subscription that reconnects by itself: iterate it with
 * `for await`. It ends (the loop throws one {@link EvmeshError}) only when the broker refuses
 * it for good (denied, bad request, access revoked, or a subscription unknown on three attempts
 * in a row); leaving the loop
 * (`break`, `return`, a throw in its body) closes the consumer as {@link close} does.
 */
export class Consumer extends Feed<Delivery> {
  private readonly transport: Transport;
  private readonly window: number;
  private readonly ack: boolean;
  private readonly pollWaitMs: number;
  private generation = 0;
  private pending: AckMsg[] = [];
  private flushScheduled = false;
  /** Sends what {@link pending} holds over the current session (none between sessions). */
  private flusher: (() => void) | undefined;
  /** HTTP acks in order, one at a time. */
  private postChain: Promise<void> = Promise.resolve();
  /** The last SSE delivery id seen, for `Last-Event-ID`. */
  private lastEventId: string | undefined;
  /** Deliveries of this session not yet settled. */
  private outstanding = 0;
  /** Whether a delivery of this session was nacked (then `Last-Event-ID`, an ack of the partition up to it, is not offered). */
  private nacked = false;
  private seed = 0;

  /** @internal */
  constructor(
    private readonly client: Conn,
    /** The subscription consumed. */
    readonly subscription: string,
    private readonly options: ConsumerOptions,
  ) {
    super();
    this.transport = options.transport ?? "websocket";
    this.window = Math.min(4096, Math.max(1, Math.floor(options.window ?? 256)));
    this.ack = options.noAck !== true;
    // Polls that return at once in a loop would spin: at least 100 ms.
    this.pollWaitMs = Math.min(60_000, Math.max(100, Math.floor(options.pollWaitMs ?? 10_000)));
    this.task = this.run().catch((e: unknown) => {
      // A bug here must not leave the reader waiting forever.
      this.finish({ type: "fatal", error: asEvmeshError(e, "protocol", "consumer") });
    });
  }

  /** The next delivery, or `undefined` once the consumer has ended; rejects once with a fatal {@link EvmeshError}. */
  async nextDelivery(): Promise<Delivery | undefined> {
    const r = await this.out.next();
    return r.done === true ? undefined : r.value;
  }

  private get stopped(): boolean {
    return this.stopCtl.signal.aborted;
  }

  private setState(s: ConnectionState): void {
    this.cell.set(s);
  }

  private async run(): Promise<void> {
    let step = 0;
    let unknown = 0;
    while (!this.stopped) {
      this.setState({ kind: "connecting" });
      this.generation += 1;
      this.outstanding = 0;
      this.nacked = false;
      const home = await this.recommend();
      let end = home instanceof URL ? await this.session(home) : home;
      // With many instances a subscription made at one a moment ago may not have reached its
      // home yet: a 404 is final only when three attempts in a row meet it.
      if (end.type === "fatal" && end.error.status === 404 && unknown < UNKNOWN_TRIES - 1) {
        unknown += 1;
        end = { type: "retry", reason: end.error.message, immediate: false, afterMs: undefined, attached: false };
      } else if (end.type !== "fatal") {
        unknown = 0;
      }
      if (end.type !== "retry") {
        this.finish(end);
        return;
      }
      if (end.attached) step = 0;
      let delay = 0;
      if (!end.immediate) {
        delay = Math.max(backoffDelay(this.client.backoff, step), end.afterMs ?? 0);
        step += 1;
      }
      this.setState({ kind: "disconnected", reason: end.reason, retryInMs: delay });
      if (!(await sleep(delay, this.stopCtl.signal))) break;
    }
    this.finish(STOPPED);
  }

  private finish(end: End): void {
    if (end.type === "fatal") {
      this.setState({ kind: "closed", reason: end.error.message });
      this.out.fail(end.error);
    } else {
      this.setState({ kind: "closed", reason: "closed by the client" });
      this.out.clear();
      this.out.end();
    }
  }

  /** The subscription's home, asked of each URL the client knows in turn. */
  private async recommend(): Promise<URL | End> {
    const seeds = this.client.seeds;
    const path = `/session/recommend?${new URLSearchParams({ subscription: this.subscription })}`;
    let last: EvmeshError | undefined;
    for (let n = 0; n < seeds.length; n++) {
      const base = seeds[this.seed % seeds.length];
      if (base === undefined) break;
      try {
        const a = await this.client.call(base, { method: "GET", path, signal: this.stopCtl.signal });
        return homeFrom(a.text, base, this.client);
      } catch (e) {
        if (this.stopped) return STOPPED;
        const err = asEvmeshError(e, "http", "recommend");
        if (!err.transient) return { type: "fatal", error: err };
        last = err;
      }
      this.seed += 1;
    }
    return { type: "retry", reason: `recommend: ${last?.message ?? "no url"}`, immediate: false, afterMs: last?.retryAfterMs, attached: false };
  }

  private session(home: URL): Promise<End> {
    switch (this.transport) {
      case "sse":
        return this.sse(home);
      case "longpoll":
        return this.poll(home);
      default:
        return this.websocket(home);
    }
  }

  /** The attach URL's path and query. */
  private attachQuery(path: string): string {
    const q = new URLSearchParams({ subscription: this.subscription });
    const o = this.options;
    if (o.clientId !== undefined) q.set("clientId", o.clientId);
    if (!this.ack) q.set("ack", "none");
    // The window rides on the attach, so the first burst already keeps to it.
    if (this.ack && this.transport !== "longpoll") q.set("credit", String(this.window));
    if (o.sql !== undefined) q.set("sql", o.sql);
    if (o.filters !== undefined && o.filters.length > 0) q.set("filters", JSON.stringify(o.filters));
    return `${path}?${q}`;
  }

  /** Hands one delivered event (its JSON text) to the reader. */
  private deliverText(text: string): void {
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      this.warn(new EvmeshError({ kind: "protocol", message: `a delivery that is not JSON, skipped: ${short(text)}` }));
      return;
    }
    this.deliver(value);
  }

  /** Hands one delivered event (parsed JSON) to the reader. */
  private deliver(value: unknown): void {
    const event = asCloudEvent(value);
    const id =
      value !== null && typeof value === "object" && typeof (value as { emdeliveryid?: unknown }).emdeliveryid === "string"
        ? (value as { emdeliveryid: string }).emdeliveryid
        : undefined;
    if (event === undefined || id === undefined) {
      // Not an event this client can read: refused so that it is dead-lettered rather than
      // silently skipped, and said.
      if (id !== undefined && this.ack) this.settle({ generation: this.generation, id, nack: true });
      this.warn(new EvmeshError({ kind: "protocol", message: `a delivery that is not a CloudEvent with emdeliveryid, skipped: ${short(JSON.stringify(value) ?? "")}` }));
      return;
    }
    const num = (name: string, dflt: number): number => {
      const n = Number(extension(event, name));
      return Number.isFinite(n) && extension(event, name) !== undefined ? n : dflt;
    };
    const generation = this.generation;
    const d = new Delivery(event, id, num("empartition", 0), num("emoffset", 0), num("emattempt", 1), (nack) => {
      if (this.ack) this.settle({ generation, id, nack });
    });
    if (this.ack) this.outstanding += 1;
    if (this.transport === "sse") this.lastEventId = id;
    this.out.push(d);
  }

  private warn(e: EvmeshError): void {
    try {
      this.options.onError?.(e);
    } catch {
      // The listener's failure is its own.
    }
  }

  private settle(m: AckMsg): void {
    if (m.generation === this.generation) {
      this.outstanding = Math.max(0, this.outstanding - 1);
      if (m.nack) this.nacked = true;
    }
    this.pending.push(m);
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      // Acks wait for the next turn of the event loop, so that one message carries all the
      // deliveries a burst brought (and the broker reads one, not many).
      setTimeout(() => {
        this.flushScheduled = false;
        this.flusher?.();
      }, 0);
    }
  }

  /** Takes the acks and nacks waiting. */
  private take(): Settled {
    const s: Settled = { acks: [], nacks: [], staleAcks: [], staleNacks: [] };
    for (const m of this.pending) {
      const current = m.generation === this.generation;
      (current ? (m.nack ? s.nacks : s.acks) : m.nack ? s.staleNacks : s.staleAcks).push(m.id);
    }
    this.pending = [];
    return s;
  }

  /** `POST /events/ack` at `base` (SSE, long-poll, and acks of ended sessions, which the broker still counts for a while). */
  private async postAcks(base: URL | string, ids: string[], nack: boolean): Promise<void> {
    for (const batch of batches(ids)) {
      const body: Record<string, unknown> = { subscription: this.subscription, ids: batch };
      if (this.options.clientId !== undefined) body["clientId"] = this.options.clientId;
      if (nack) body["nack"] = true;
      await this.client.call(base, { method: "POST", path: "/events/ack", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
    }
  }

  /** Best effort: an ack that does not count means the event comes again. */
  private async postStale(base: URL | string, s: Settled): Promise<void> {
    await this.postAcks(base, s.staleAcks, false).catch(() => undefined);
    await this.postAcks(base, s.staleNacks, true).catch(() => undefined);
  }

  /** Queues an HTTP flush of what waits; `onFailure` hears of a current ack that could not be sent. */
  private flushHttp(base: URL | string, onFailure?: (e: EvmeshError) => void): Promise<void> {
    this.postChain = this.postChain.then(async () => {
      const s = this.take();
      try {
        await this.postAcks(base, s.acks, false);
        await this.postAcks(base, s.nacks, true);
      } catch (e) {
        onFailure?.(asEvmeshError(e, "http", "acking"));
      }
      await this.postStale(base, s);
    });
    return this.postChain;
  }

  private async websocket(home: URL): Promise<End> {
    let conn: WsConn;
    let url: string;
    try {
      ({ conn, url } = await this.client.websocket(home, this.attachQuery("/events/ws"), this.stopCtl.signal));
    } catch (e) {
      return this.stopped ? STOPPED : refused(e);
    }
    this.setState({ kind: "connected", url });
    const flush = (): void => {
      const s = this.take();
      for (const [ids, type] of [
        [s.acks, "ack"],
        [s.nacks, "nack"],
      ] as const) {
        // One that cannot be sent: the session is ending, and the event comes again.
        for (const batch of batches(ids)) conn.send(JSON.stringify({ type, ids: batch }));
      }
      if (s.staleAcks.length + s.staleNacks.length > 0) void this.postStale(url, s);
    };
    this.flusher = flush;
    // Closing: what was acked goes out first, then the close; the broker reads the acks before it sees the close.
    const onStop = (): void => {
      flush();
      void conn.close(1000, "", 2000).then(() => conn.interrupt("closed by the client"));
    };
    this.stopCtl.signal.addEventListener("abort", onStop, { once: true });
    try {
      if (this.stopped) onStop();
      else if (this.pending.length > 0) flush();
      for (;;) {
        const m = await conn.next();
        if (this.stopped) {
          await conn.close(1000, "", 2000);
          return STOPPED;
        }
        if (m.kind === "text") this.deliverText(m.data);
        else if (m.kind === "close") return await this.closed(m.code, m.reason);
      }
    } finally {
      this.flusher = undefined;
      this.stopCtl.signal.removeEventListener("abort", onStop);
    }
  }

  /** What a close code from the broker means for the next attempt. */
  private async closed(code: number, reason: string): Promise<End> {
    const text = `closed ${code} ${reason}`.trimEnd();
    const fatal = (): End => ({
      type: "fatal",
      error: new EvmeshError({ kind: "closed", message: `closed by the broker: ${text}`, closeCode: code, closeReason: reason }),
    });
    if (code === 1012) return { type: "retry", reason: text, immediate: true, afterMs: undefined, attached: true };
    if (code === 1008 && reason === "token expired") {
      try {
        return (await this.client.tokenRejected()) ? { type: "retry", reason: text, immediate: true, afterMs: undefined, attached: true } : fatal();
      } catch (e) {
        return { type: "fatal", error: asEvmeshError(e, "token", "token refresh") };
      }
    }
    if ((code === 1008 && reason === "access revoked") || code === 1002 || code === 1003 || code === 1007) return fatal();
    return retry(text, true);
  }

  private async sse(home: URL): Promise<End> {
    const headers: Record<string, string> = { accept: "text/event-stream" };
    if (this.lastEventId !== undefined) headers["last-event-id"] = this.lastEventId;
    this.lastEventId = undefined;
    const ctl = new AbortController();
    const unlink = link(this.stopCtl.signal, ctl);
    let response: Response;
    let url: string;
    try {
      ({ response, url } = await this.client.open(home, { method: "GET", path: this.attachQuery("/events/sse"), headers, signal: ctl.signal }));
    } catch (e) {
      unlink();
      return this.stopped ? STOPPED : refused(e);
    }
    this.setState({ kind: "connected", url });
    let failure: string | undefined;
    const flush = (): void => {
      void this.flushHttp(url, (e) => {
        failure ??= `acking: ${e.message}`;
        ctl.abort();
      });
    };
    this.flusher = flush;
    if (this.pending.length > 0) flush();
    const reader = response.body?.getReader();
    let reason = "the stream ended";
    if (reader !== undefined) {
      const parser = new SseParser();
      // The broker sends a comment every 15 s: silence past three of them is a dead connection.
      let idle = false;
      let timer = setTimeout(() => ((idle = true), ctl.abort()), 45_000);
      try {
        for (;;) {
          const r = await reader.read();
          if (r.done) break;
          clearTimeout(timer);
          timer = setTimeout(() => ((idle = true), ctl.abort()), 45_000);
          for (const ev of parser.feedBytes(r.value)) {
            if (this.stopped) break;
            this.deliverText(ev.data);
          }
        }
      } catch (e) {
        reason = failure ?? (idle ? "no heartbeat for 45 s" : `reading: ${e instanceof Error ? e.message : String(e)}`);
      } finally {
        clearTimeout(timer);
        ctl.abort();
      }
    }
    unlink();
    this.flusher = undefined;
    if (this.stopped) {
      await this.flushHttp(url);
      return STOPPED;
    }
    // `Last-Event-ID` is offered on the next attach only when every delivery of this session
    // was acked, since the broker takes it as an ack of the partition up to that event.
    if (this.outstanding > 0 || this.nacked) this.lastEventId = undefined;
    return retry(reason, true);
  }

  private async poll(home: URL): Promise<End> {
    const max = Math.min(this.window, 1000);
    const path = `${this.attachQuery("/events/poll")}&max=${max}&waitMs=${this.pollWaitMs}`;
    let base: URL | string = home;
    let attached = false;
    this.flusher = () => void this.flushHttp(base);
    try {
      if (this.pending.length > 0) void this.flushHttp(base);
      for (;;) {
        if (this.stopped) break;
        let status: number;
        let text: string;
        try {
          ({ status, text, url: base } = await this.client.call(base, {
            method: "GET",
            path,
            timeoutMs: this.pollWaitMs + this.client.timeoutMs,
            signal: this.stopCtl.signal,
          }));
        } catch (e) {
          if (this.stopped) break;
          const err = asEvmeshError(e, "http", "poll");
          return attached && err.transient ? retry(err.message, true) : refused(err);
        }
        if (!attached) {
          attached = true;
          this.setState({ kind: "connected", url: base });
        }
        if (status === 204) continue;
        let events: unknown;
        try {
          events = JSON.parse(text);
        } catch {
          events = undefined;
        }
        if (!Array.isArray(events)) return retry(`a poll answer that is not a JSON array: ${short(text)}`, true);
        for (const ev of events) {
          if (this.stopped) break;
          this.deliver(ev);
        }
      }
    } finally {
      this.flusher = undefined;
    }
    await this.flushHttp(base);
    return STOPPED;
  }
}

/** The home a recommend answer names (never an http home for an https client), else `base`. */
function homeFrom(text: string, base: URL, client: Conn): URL {
  try {
    const v = JSON.parse(text) as { instanceUrl?: unknown };
    if (typeof v.instanceUrl === "string") {
      const u = new URL(v.instanceUrl);
      if ((u.protocol === "http:" || u.protocol === "https:") && client.keepsTls(u, base)) return u;
    }
  } catch {
    // No usable answer: attach where we asked.
  }
  return base;
}

/** Ids in one ack message or request (the broker takes at most 10,000). */
const ACK_BATCH = 4096;

/** `ids` in pieces of at most {@link ACK_BATCH}. */
function batches(ids: string[]): string[][] {
  const out: string[][] = [];
  for (let i = 0; i < ids.length; i += ACK_BATCH) out.push(ids.slice(i, i + ACK_BATCH));
  return out;
}
