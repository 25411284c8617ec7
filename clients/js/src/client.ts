/**
 * The {@link Client}: where the broker is, how to prove who we are, and the one path every
 * HTTP request and WebSocket handshake takes (credentials, 401 -> refresh once, 307/308 followed
 * with method and body kept, never from https to http, at most three times; problem+json errors).
 * @module
 */

import { DEFAULT_BACKOFF, type Backoff } from "./backoff.js";
import { Consumer, type ConsumerOptions } from "./consume.js";
import { EvmeshError, asEvmeshError } from "./errors.js";
import type { CloudEvent } from "./event.js";
import { publish, publishBatch, openPublisher, type Published, type Publisher, type PublishOptions, type PublisherOptions } from "./publish.js";
import { reply, request, serve, type Handler } from "./request.js";
import { Streaming } from "./streaming.js";
import { subscribe, unsubscribe, type Subscribed, type Subscription } from "./subscription.js";
import { Tokens, type TokenRefresh } from "./token.js";
import { WsConn, webSocketConstructor, type WebSocketConstructor } from "./ws.js";
import { link, type Answer, type Call, type Conn, type Opened } from "./conn.js";

export type { Answer, Call, Opened } from "./conn.js";

/** How many redirects one request follows. */
const MAX_REDIRECTS = 3;

/** Whether this is a browser (or a browser worker), whose `fetch` cannot hand out a 307 (`redirect: "manual"` gives an opaque answer). */
const BROWSER =
  typeof (globalThis as { document?: unknown }).document !== "undefined" ||
  typeof (globalThis as { WorkerGlobalScope?: unknown }).WorkerGlobalScope !== "undefined";

/** Options of a {@link Client}. */
export interface ClientOptions {
  /** A static bearer token. */
  token?: string;
  /**
   * A callback that returns a fresh token. It is called before the first request, again
   * `refreshLeadMs` before the token's `expiresAt`, and when the broker answers 401 or closes
   * a session because the token expired.
   */
  tokenRefresh?: TokenRefresh;
  /** How long before a token's expiry the refresh callback is called (default 30000). */
  refreshLeadMs?: number;
  /**
   * The limit for one request and its answer, and for a WebSocket handshake (default 30000);
   * streams (SSE, WebSocket, long-poll) are not cut by it once they answered. Request-reply
   * waits its own timeout plus this.
   */
  timeoutMs?: number;
  /** Other broker instances to ask when the first does not answer (many instances): recommend tries the URLs in turn. */
  fallbackUrls?: string[];
  /** The reconnect delays of consumers, agents and session subscribers (default 500 ms to 20 s). */
  backoff?: Partial<Backoff>;
  /**
   * The WebSocket constructor (default `globalThis.WebSocket`). Node 20 has none: pass the
   * `ws` package's `WebSocket` here, or run Node 22+ (or 20.10+ with `--experimental-websocket`).
   */
  WebSocket?: WebSocketConstructor;
}




/**
 * A connection to an evmesh broker (or to several instances of one). Every method goes through
 * one request path: `Authorization: Bearer` (and `?access_token=` on WebSocket URLs, which
 * browsers cannot give headers), a 401 answered by refreshing the token once, 307/308 followed
 * with method and body kept (at most 3, never from https to http), and refusals thrown as
 * {@link EvmeshError}s carrying the problem+json body.
 */
export class Client implements Conn {
  /** The broker URLs: the first given, then the fallbacks. @internal */
  readonly seeds: readonly URL[];
  /** The reconnect delays. @internal */
  readonly backoff: Backoff;
  /** The limit for one request (ms). @internal */
  readonly timeoutMs: number;
  private readonly tokens: Tokens;
  private readonly WebSocketCtor: WebSocketConstructor | undefined;
  /** `false` once this platform's fetch turned out to hide redirects (a browser). */
  private manualRedirects = !BROWSER;

  /**
   * A client of the broker at `url` (`http://host:port` or `https://...`); throws a `config`
   * {@link EvmeshError} for an unusable URL. Nothing is sent until a method is called.
   */
  constructor(url: string, options: ClientOptions = {}) {
    this.seeds = [url, ...(options.fallbackUrls ?? [])].map(parseBase);
    this.tokens = new Tokens(options.token, options.tokenRefresh, options.refreshLeadMs ?? 30_000);
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.backoff = { minMs: options.backoff?.minMs ?? DEFAULT_BACKOFF.minMs, maxMs: options.backoff?.maxMs ?? DEFAULT_BACKOFF.maxMs };
    this.WebSocketCtor = options.WebSocket;
  }

  /** The first URL the client was given. */
  get url(): string {
    return this.seeds[0]?.toString() ?? "";
  }

  /** Publishes `event` to `topic` (structured mode unless `{mode: "binary"}`); resolves once the broker stored it at its configured durability. */
  publish(topic: string, event: CloudEvent, options: PublishOptions = {}): Promise<Published> {
    return publish(this, topic, event, options);
  }

  /** Publishes `events` to `topic` as one batch: all are stored, results in request order, or none (an invalid event refuses the batch). */
  publishBatch(topic: string, events: CloudEvent[]): Promise<Published[]> {
    return publishBatch(this, topic, events);
  }

  /** A pipelined publisher to `topic` over one WebSocket (`GET /events/ws?publish=T`), at most `maxInFlight` (default 256) events unanswered. */
  publisher(topic: string, options: PublisherOptions = {}): Promise<Publisher> {
    return openPublisher(this, topic, options);
  }

  /** Creates `subscription`, or confirms it exists as defined (201 -> `created: true`, 200 -> `false`); a different definition of the same name is a 409 {@link EvmeshError}. */
  subscribe(subscription: Subscription): Promise<Subscribed> {
    return subscribe(this, subscription);
  }

  /** Removes subscription `name`; its attached sessions are closed. */
  unsubscribe(name: string): Promise<void> {
    return unsubscribe(this, name);
  }

  /** A consumer of subscription `name`, attaching in the background at once; see {@link Consumer}. */
  consumer(name: string, options: ConsumerOptions = {}): Consumer {
    return new Consumer(this, name, options);
  }

  /** Publishes `event` to `topic` as a request and waits up to `timeoutMs` (default 30000) for the reply; none in time is a 504 {@link EvmeshError}. */
  request(topic: string, event: CloudEvent, timeoutMs = 30_000): Promise<CloudEvent> {
    return request(this, topic, event, timeoutMs);
  }

  /** Answers `requestEvent` (carrying `emcorrelationid`) with `replyEvent`; a requester that stopped waiting makes this a 404 {@link EvmeshError}. */
  reply(requestEvent: CloudEvent, replyEvent: CloudEvent): Promise<void> {
    return reply(this, requestEvent, replyEvent);
  }

  /**
   * Serves requests from `consumer` until it ends: each event goes to `handler`, its answer (if
   * any) is sent back as the reply, and the event is acknowledged. Resolves when the consumer
   * is closed; rejects with the consumer's fatal error or the handler's.
   */
  serve(consumer: Consumer, handler: Handler): Promise<void> {
    return serve(this, consumer, handler);
  }

  /** Streaming sessions: agent calls (Mode 1) and session pub/sub (Mode 2). */
  streaming(): Streaming {
    return new Streaming(this);
  }

  /** The URL `path` names at `base` (or the first URL). @internal */
  at(base: string | URL | undefined, path: string): URL {
    try {
      return new URL(path, base ?? this.seeds[0]);
    } catch (e) {
      throw new EvmeshError({ kind: "config", message: `${path}: not a URL`, cause: e });
    }
  }

  /**
   * Sends `c` to `base` (default: the first URL), following redirects and refreshing a refused
   * token once, and reads the whole answer within `c.timeoutMs` (default the client's).
   * @internal
   */
  async call(base: string | URL | undefined, c: Call): Promise<Answer> {
    const ctl = new AbortController();
    const unlink = link(c.signal, ctl);
    const limit = c.timeoutMs ?? this.timeoutMs;
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ctl.abort();
    }, limit);
    try {
      const { response, url } = await this.open(base, { ...c, signal: ctl.signal }, Infinity);
      const text = await response.text();
      return { status: response.status, text, url };
    } catch (e) {
      if (timedOut) throw new EvmeshError({ kind: "timeout", message: `${c.method} ${c.path}: no answer within ${limit} ms`, cause: e });
      throw asEvmeshError(e, "http", `${c.method} ${c.path}`);
    } finally {
      clearTimeout(timer);
      unlink();
    }
  }

  /** {@link call}, the answer parsed as JSON (a `protocol` error when it is not). @internal */
  async json<T>(base: string | URL | undefined, c: Call): Promise<T> {
    const a = await this.call(base, c);
    try {
      return JSON.parse(a.text) as T;
    } catch (e) {
      throw new EvmeshError({ kind: "protocol", message: `${c.method} ${c.path}: an answer that is not JSON: ${a.text.slice(0, 200)}`, cause: e });
    }
  }

  /**
   * Sends `c` to `base` (default: the first URL), following redirects and refreshing a refused
   * token once; returns a 2xx response unread (a stream's) and the URL that answered. The
   * answer's head must come within `headerTimeoutMs` (default the client's timeout).
   * @internal
   */
  async open(base: string | URL | undefined, c: Call, headerTimeoutMs = this.timeoutMs): Promise<Opened> {
    const start = this.at(base, c.path);
    let url = start;
    let refreshed = false;
    let redirects = 0;
    for (;;) {
      const token = await this.tokens.get();
      const headers: Record<string, string> = { ...c.headers };
      if (token !== undefined) headers["authorization"] = `Bearer ${token}`;
      const manual = this.manualRedirects;
      const init: RequestInit = { method: c.method, headers, redirect: manual ? "manual" : "follow", cache: "no-store" };
      if (c.body !== undefined) init.body = c.body;
      const response = await this.fetchHead(url, init, c.signal, headerTimeoutMs, `${c.method} ${c.path}`);
      if (response.type === "opaqueredirect") {
        // A browser: it follows redirects itself (and never hands out their location).
        this.manualRedirects = false;
        continue;
      }
      let answered = url;
      if (!manual && response.redirected && response.url !== "") {
        answered = new URL(response.url);
        if (start.protocol === "https:" && answered.protocol !== "https:") {
          await discard(response);
          throw new EvmeshError({ kind: "redirect", message: `redirect refused: from ${start} to ${answered}: https is never left for http` });
        }
      }
      const status = response.status;
      if (status >= 200 && status < 300) return { response, url: answered.toString() };
      if (manual && (status === 307 || status === 308)) {
        redirects += 1;
        url = redirectTarget(url, response.headers.get("location"), redirects);
        await discard(response);
        continue;
      }
      if (status === 401 && !refreshed && (await this.tokens.refresh(token))) {
        refreshed = true;
        await discard(response);
        continue;
      }
      throw await refusal(response);
    }
  }

  /**
   * One fetch, its head within `timeoutMs`; `signal` goes on aborting the body when `stream`
   * (then it must be a signal of this stream alone: the link lasts as long as it does).
   */
  private async fetchHead(url: URL, init: RequestInit, signal: AbortSignal | undefined, timeoutMs: number, what: string, stream = true): Promise<Response> {
    const ctl = new AbortController();
    const unlink = link(signal, ctl);
    let timedOut = false;
    const timer = Number.isFinite(timeoutMs)
      ? setTimeout(() => {
          timedOut = true;
          ctl.abort();
        }, timeoutMs)
      : undefined;
    try {
      const response = await fetch(url, { ...init, signal: ctl.signal });
      if (!stream) unlink();
      return response;
    } catch (e) {
      unlink();
      if (timedOut) throw new EvmeshError({ kind: "timeout", message: `${what}: no answer within ${timeoutMs} ms`, cause: e });
      if (signal?.aborted === true) throw new EvmeshError({ kind: "disconnected", message: `${what}: aborted`, cause: e });
      throw new EvmeshError({ kind: "http", message: `${what} at ${url.host}: ${describe(e)}`, cause: e });
    } finally {
      if (timer !== undefined) clearTimeout(timer);
    }
  }

  /**
   * Opens a WebSocket (subprotocol `cloudevents.json`) at `path` of `base`, the token as
   * `?access_token=`. A WebSocket cannot show why its handshake failed, so after a failure the
   * same URL is asked over HTTP: a 307 is followed, a 401 refreshes the token once, another
   * refusal (404, 403, 409, 429 with `Retry-After`...) is thrown as it is; a broker that
   * answers "not a WebSocket upgrade" (the URL is fine) leaves the handshake's own, transient, error.
   * @internal
   */
  async websocket(base: string | URL | undefined, path: string, signal?: AbortSignal): Promise<{ conn: WsConn; url: string }> {
    const ctor = webSocketConstructor(this.WebSocketCtor);
    const start = this.at(base, path);
    let url = start;
    let refreshed = false;
    let redirects = 0;
    for (;;) {
      const token = await this.tokens.get();
      const wsUrl = new URL(url);
      wsUrl.protocol = url.protocol === "https:" ? "wss:" : "ws:";
      if (token !== undefined) wsUrl.searchParams.set("access_token", token);
      let failure: EvmeshError;
      try {
        const conn = await WsConn.open(ctor, wsUrl.toString(), ["cloudevents.json"], this.timeoutMs, signal);
        return { conn, url: url.toString() };
      } catch (e) {
        failure = asEvmeshError(e, "websocket", "WebSocket");
        if (failure.kind === "config" || signal?.aborted === true) throw failure;
      }
      let probe: Response;
      try {
        probe = await this.probe(url, token, signal);
      } catch {
        throw failure;
      }
      const status = probe.status;
      if (this.manualRedirects && (status === 307 || status === 308)) {
        redirects += 1;
        url = redirectTarget(url, probe.headers.get("location"), redirects);
        await discard(probe);
        continue;
      }
      if (!this.manualRedirects && probe.redirected && probe.url !== "" && probe.url !== url.toString()) {
        redirects += 1;
        url = redirectTarget(url, probe.url, redirects);
        await discard(probe);
        continue;
      }
      if (status === 401 && !refreshed && (await this.tokens.refresh(token))) {
        refreshed = true;
        await discard(probe);
        continue;
      }
      if (status >= 200 && status < 300) {
        await discard(probe);
        throw failure;
      }
      const refused = await refusal(probe);
      if (status === 400 && /upgrade/i.test(refused.detail ?? "")) throw failure;
      throw refused;
    }
  }

  /** `GET url` with the token as a header, redirects not followed (where the platform lets us). */
  private async probe(url: URL, token: string | undefined, signal: AbortSignal | undefined): Promise<Response> {
    const headers: Record<string, string> = { accept: "application/problem+json" };
    if (token !== undefined) headers["authorization"] = `Bearer ${token}`;
    for (;;) {
      const init: RequestInit = { method: "GET", headers, redirect: this.manualRedirects ? "manual" : "follow", cache: "no-store" };
      const r = await this.fetchHead(url, init, signal, this.timeoutMs, `GET ${url.pathname}`, false);
      if (r.type !== "opaqueredirect") return r;
      this.manualRedirects = false;
    }
  }

  /** After a session ended because its token expired: `true` once a new token is there (a callback made one). @internal */
  async tokenRejected(): Promise<boolean> {
    // The token held now is the one the session ended with (or a newer one another caller
    // already fetched: then the callback is not called again).
    return this.tokens.refresh(this.tokens.currentValue());
  }

  /** Whether `home` may be used by a client first given `base`: never an http home for an https client. @internal */
  keepsTls(home: URL, base: URL | undefined = this.seeds[0]): boolean {
    return base?.protocol !== "https:" || home.protocol === "https:";
  }
}

/** A seed URL, checked. */
function parseBase(u: string): URL {
  let url: URL;
  try {
    url = new URL(u);
  } catch (e) {
    throw new EvmeshError({ kind: "config", message: `url ${u}: not a URL`, cause: e });
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || url.host === "") {
    throw new EvmeshError({ kind: "config", message: `url ${u}: expected http://HOST[:PORT] or https://HOST[:PORT]` });
  }
  return url;
}

/**
 * Where a 307/308 sends the client: `location` resolved against `from`, refused when it leaves
 * https for http, is missing, is not http(s), or is redirect number `count` > 3.
 * @internal
 */
export function redirectTarget(from: URL, location: string | null, count: number): URL {
  if (count > MAX_REDIRECTS) {
    throw new EvmeshError({ kind: "redirect", message: `redirect refused: more than ${MAX_REDIRECTS} redirects (last to ${from})` });
  }
  if (location === null || location === "") {
    throw new EvmeshError({ kind: "redirect", message: "redirect refused: a redirect without a location" });
  }
  let next: URL;
  try {
    next = new URL(location, from);
  } catch (e) {
    throw new EvmeshError({ kind: "redirect", message: `redirect refused: location ${location} is not a URL`, cause: e });
  }
  if (from.protocol === "https:" && next.protocol !== "https:") {
    throw new EvmeshError({ kind: "redirect", message: `redirect refused: from ${from} to ${next}: https is never left for http` });
  }
  if (next.protocol !== "http:" && next.protocol !== "https:") {
    throw new EvmeshError({ kind: "redirect", message: `redirect refused: to ${next}: not http or https` });
  }
  return next;
}

/** A refusal's {@link EvmeshError}, its body read (an unreadable body is an empty one). @internal */
export async function refusal(response: Response): Promise<EvmeshError> {
  let body = "";
  try {
    body = await response.text();
  } catch {
    // The status says enough.
  }
  return EvmeshError.fromAnswer(response.status, response.headers.get("retry-after"), body);
}

/** Reads and drops a body so its connection can be reused. */
async function discard(response: Response): Promise<void> {
  try {
    await response.body?.cancel();
  } catch {
    // Nothing to drop.
  }
}


/** A fetch failure in a few words (undici hides the reason in `cause`). */
function describe(e: unknown): string {
  if (e instanceof Error) {
    const cause = (e as { cause?: unknown }).cause;
    if (cause instanceof Error) {
      const code = (cause as { code?: unknown }).code;
      return `${e.message} (${typeof code === "string" ? code : cause.message})`;
    }
    return e.message;
  }
  return String(e);
}
