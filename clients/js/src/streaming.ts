/**
 * Streaming sessions: the client side of an agent streaming call ({@link Session.call} -> an
 * async iterable of {@link Chunk}s, resumed after a dropped connection from the last chunk
 * seen) and session pub/sub ({@link SessionSubscriber}, {@link SessionPublisher}). The agent
 * side is in `agent.ts`.
 * @module
 */

import { backoffDelay, sleep } from "./backoff.js";
import { link, type Conn } from "./conn.js";
import { EvmeshError, asEvmeshError } from "./errors.js";
import { extension, parseEvent, toJson, type CloudEvent } from "./event.js";
import { asPublished, type Published } from "./publish.js";
import { Feed } from "./feed.js";
import { SseParser } from "./sse.js";

/**
 * A path segment with what would change the path percent-encoded (RFC 3986 `pchar` kept:
 * session ids are `<agentId>:<uuid>`, and the broker reads the path undecoded).
 */
function segment(s: string): string {
  let out = "";
  for (const b of new TextEncoder().encode(s)) {
    const c = String.fromCharCode(b);
    out += /[A-Za-z0-9\-._~:@!$&'()*+,;=]/.test(c) ? c : `%${b.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

/** The broker sends an SSE comment every 15 s: silence past three of them is a dead connection. */
const SSE_IDLE_MS = 45_000;

/** Streaming sessions of a client; see {@link Client.streaming}. */
export class Streaming {
  /** @internal */
  constructor(private readonly client: Conn) {}

  /** Opens a session for `clientId` with agent `agentId` (or the least loaded agent the caller may call, when absent). */
  async openSession(clientId: string, agentId?: string): Promise<Session> {
    const body: Record<string, string> = { clientId };
    if (agentId !== undefined) body["agentId"] = agentId;
    const o = await this.client.json<{ sessionId?: unknown; agentId?: unknown; instanceUrl?: unknown }>(undefined, {
      method: "POST",
      path: "/session/open",
      body: JSON.stringify(body),
      headers: { "content-type": "application/json" },
    });
    if (o === null || typeof o !== "object" || typeof o.sessionId !== "string") {
      throw new EvmeshError({ kind: "protocol", message: "a session opened without a sessionId" });
    }
    const agent = typeof o.agentId === "string" ? o.agentId : (agentId ?? "");
    return new Session(this.client, o.sessionId, agent, this.usableHome(o.instanceUrl));
  }

  /** A session opened before (by id), served wherever recommend says. */
  async session(sessionId: string): Promise<Session> {
    const home = await this.home(sessionId);
    const colon = sessionId.indexOf(":");
    return new Session(this.client, sessionId, colon < 0 ? "" : sessionId.slice(0, colon), home);
  }

  /** Follows session `sessionId`'s events (Mode 2) from its head; reconnects by itself and resumes after the last event it handed out. */
  subscribeSession(sessionId: string): SessionSubscriber {
    return new SessionSubscriber(this, this.client, sessionId);
  }

  /** Publishes to session `sessionId` (Mode 2). */
  sessionPublisher(sessionId: string): SessionPublisher {
    return new SessionPublisher(this.client, `/session/publish/${segment(sessionId)}`);
  }

  /** The home of session `id`, as recommend names it (`undefined`: the first URL). @internal */
  async home(id: string, signal?: AbortSignal): Promise<URL | undefined> {
    const c = { method: "GET" as const, path: `/session/recommend?${new URLSearchParams({ sessionId: id })}` };
    const v = await this.client.json<{ instanceUrl?: unknown }>(undefined, signal === undefined ? c : { ...c, signal });
    return this.usableHome(v?.instanceUrl);
  }

  private usableHome(u: unknown): URL | undefined {
    if (typeof u !== "string") return undefined;
    try {
      const url = new URL(u);
      return (url.protocol === "http:" || url.protocol === "https:") && this.client.keepsTls(url) ? url : undefined;
    } catch {
      return undefined;
    }
  }
}

/** What one event of a turn's stream is: a piece, the last piece, an error that ends the turn, or a note that chunks were dropped. */
export type ChunkKind = "chunk" | "done" | "error" | "dropped";

/** One event of a turn's stream. */
export interface Chunk {
  /** The chunk's sequence number within its turn (the SSE `id:`). */
  seq: number | undefined;
  /** What it is. */
  kind: ChunkKind;
  /** Its data as text (a JSON string's text; other JSON values as JSON; for `dropped`, `{"dropped":N}`). */
  data: string;
}

/** An agent streaming session, from {@link Streaming.openSession}. */
export class Session {
  /** @internal */
  constructor(
    private readonly client: Conn,
    /** The session id (`<agentId>:<uuid>`). */
    readonly id: string,
    /** The agent the session talks to. */
    readonly agentId: string,
    private readonly home: URL | undefined,
  ) {}

  private path(verb: string): string {
    return `/session/${verb}/${segment(this.id)}`;
  }

  /**
   * Starts a turn with `prompt` and streams its chunks, up to and including the `done` or
   * `error` one. A connection lost mid-turn is resumed (`GET /session/stream/{sid}` with
   * `Last-Event-ID`) after the last chunk seen.
   */
  async call(prompt: string, options: { contentType?: string; signal?: AbortSignal } = {}): Promise<ChunkStream> {
    const ctl = new AbortController();
    link(options.signal, ctl);
    const { response, url } = await this.client.open(this.home, {
      method: "POST",
      path: this.path("stream"),
      body: prompt,
      headers: { "content-type": options.contentType ?? "text/plain; charset=utf-8", accept: "text/event-stream" },
      signal: ctl.signal,
    });
    return new ChunkStream(this.client, this.path("stream"), new URL(url), response, ctl);
  }

  /** Ends the turn in progress (its stream ends with `done`). */
  endTurn(): Promise<void> {
    return this.control("end-turn");
  }

  /** Cancels the turn in progress (its stream ends with an `error`, `cancelled`). */
  cancel(): Promise<void> {
    return this.control("cancel");
  }

  /** Closes the session. */
  close(): Promise<void> {
    return this.control("close");
  }

  private async control(verb: string): Promise<void> {
    await this.client.call(this.home, { method: "POST", path: this.path(verb) });
  }
}

/** The chunks of one turn: iterate with `for await`; ends after the turn's last. Leaving the loop stops the stream. */
export class ChunkStream implements AsyncIterable<Chunk> {
  private readonly chunks: AsyncGenerator<Chunk, void, undefined>;

  /** @internal */
  constructor(
    private readonly client: Conn,
    private readonly path: string,
    private readonly url: URL,
    first: Response,
    private readonly ctl: AbortController,
  ) {
    this.chunks = this.read(first);
  }

  /** Iterates the chunks. */
  [Symbol.asyncIterator](): AsyncGenerator<Chunk, void, undefined> {
    return this.chunks;
  }

  /** Stops reading (the turn goes on at the broker; end it with {@link Session.endTurn} or {@link Session.cancel}). */
  close(): void {
    this.ctl.abort();
  }

  private async *read(first: Response): AsyncGenerator<Chunk, void, undefined> {
    let response: Response | undefined = first;
    let lastSeq: number | undefined;
    let step = 0;
    try {
      for (;;) {
        if (response === undefined) {
          const headers: Record<string, string> = { accept: "text/event-stream" };
          if (lastSeq !== undefined) headers["last-event-id"] = String(lastSeq);
          try {
            const o = await this.client.open(this.url, { method: "GET", path: this.path, headers, signal: this.ctl.signal });
            if (o.response.status === 204) {
              throw new EvmeshError({ kind: "disconnected", message: "the turn ended while the stream was away" });
            }
            response = o.response;
            step = 0;
          } catch (e) {
            if (this.ctl.signal.aborted) return;
            const err = asEvmeshError(e, "http", "resuming the turn");
            if (err.transient && err.kind !== "disconnected" && step < 8) {
              await sleep(backoffDelay(this.client.backoff, step), this.ctl.signal);
              step += 1;
              continue;
            }
            throw err;
          }
        }
        const reader = response.body?.getReader();
        response = undefined;
        if (reader === undefined) continue;
        const parser = new SseParser();
        try {
          for (;;) {
            const r = await reader.read();
            if (r.done) break;
            for (const ev of parser.feedBytes(r.value)) {
              const kind: ChunkKind = ev.event === "done" || ev.event === "error" || ev.event === "dropped" ? ev.event : "chunk";
              const seq = ev.id !== undefined && /^\d+$/.test(ev.id) ? Number(ev.id) : undefined;
              if (seq !== undefined) lastSeq = seq;
              yield { seq, kind, data: ev.data };
              if (kind === "done" || kind === "error") return;
            }
          }
        } catch {
          if (this.ctl.signal.aborted) return;
          // The connection ended before the turn did: resume after the last chunk seen.
        } finally {
          reader.releaseLock();
        }
      }
    } finally {
      this.ctl.abort();
    }
  }
}

/** Publishes to one session's lite topic (Mode 2); see {@link Streaming.sessionPublisher}. */
export class SessionPublisher {
  /** @internal */
  constructor(
    private readonly client: Conn,
    private readonly path: string,
  ) {}

  /** Appends `event` to the session (201); resolves with its offset. */
  async publish(event: CloudEvent): Promise<Published> {
    const v = await this.client.json<unknown>(undefined, {
      method: "POST",
      path: this.path,
      body: toJson(event),
      headers: { "content-type": "application/cloudevents+json" },
    });
    return asPublished(v);
  }
}

/**
 * The events of one session (Mode 2), in order, from its head: iterate with `for await`. Over
 * SSE (`id:` is the offset, so `Last-Event-ID` resumes exactly after the last event handed
 * out), reconnecting with backoff at the session's home. Nothing is acknowledged. It ends (the
 * loop throws one {@link EvmeshError}) when refused for good: a second subscriber is a 409,
 * unless this one was attached before (the broker may not have seen the old connection go yet).
 */
export class SessionSubscriber extends Feed<CloudEvent> {
  /** @internal */
  constructor(
    private readonly streaming: Streaming,
    private readonly client: Conn,
    /** The session followed. */
    readonly sessionId: string,
  ) {
    super();
    this.task = this.run().catch((e: unknown) => this.fatal(asEvmeshError(e, "protocol", "session subscriber")));
  }

  private async run(): Promise<void> {
    const stop = this.stopCtl.signal;
    let last: string | undefined;
    let step = 0;
    let attached = false;
    while (!stop.aborted) {
      this.cell.set({ kind: "connecting" });
      let reason: string;
      try {
        const home = await this.streaming.home(this.sessionId, stop);
        const headers: Record<string, string> = { accept: "text/event-stream" };
        if (last !== undefined) headers["last-event-id"] = last;
        const ctl = new AbortController();
        const unlink = link(stop, ctl);
        try {
          const { response, url } = await this.client.open(home, { method: "GET", path: `/session/subscribe/${segment(this.sessionId)}`, headers, signal: ctl.signal });
          this.cell.set({ kind: "connected", url });
          step = 0;
          attached = true;
          reason = await this.follow(response, ctl, (id) => (last = id));
        } finally {
          ctl.abort();
          unlink();
        }
      } catch (e) {
        if (stop.aborted) break;
        const err = asEvmeshError(e, "http", "session subscribe");
        if (!err.transient && !(attached && err.status === 409)) {
          this.fatal(err);
          return;
        }
        reason = err.message;
      }
      if (stop.aborted) break;
      const delay = backoffDelay(this.client.backoff, step);
      step += 1;
      this.cell.set({ kind: "disconnected", reason, retryInMs: delay });
      if (!(await sleep(delay, stop))) break;
    }
    this.cell.set({ kind: "closed", reason: "closed by the client" });
    this.out.clear();
    this.out.end();
  }

  /** Reads one SSE connection; returns why it ended. */
  private async follow(response: Response, ctl: AbortController, seen: (id: string) => void): Promise<string> {
    const reader = response.body?.getReader();
    if (reader === undefined) return "an answer without a body";
    const parser = new SseParser();
    let idle = false;
    let timer = setTimeout(() => ((idle = true), ctl.abort()), SSE_IDLE_MS);
    try {
      for (;;) {
        const r = await reader.read();
        if (r.done) return "the stream ended";
        clearTimeout(timer);
        timer = setTimeout(() => ((idle = true), ctl.abort()), SSE_IDLE_MS);
        for (const ev of parser.feedBytes(r.value)) {
          let event: CloudEvent;
          try {
            event = parseEvent(ev.data);
          } catch {
            // Not an event this client can read: skipped (it is not asked for again).
            if (ev.id !== undefined) seen(ev.id);
            continue;
          }
          const id = ev.id ?? extension(event, "emoffset");
          if (id !== undefined) seen(id);
          this.out.push(event);
        }
        // A reader that stops reading stops this one (the broker holds the rest).
        await this.out.room(64);
      }
    } catch (e) {
      return idle ? "no heartbeat for 45 s" : `reading: ${e instanceof Error ? e.message : String(e)}`;
    } finally {
      clearTimeout(timer);
    }
  }
}
