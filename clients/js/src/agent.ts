/**
 * The agent side of streaming calls (Mode 1): an {@link Agent} registers and heart-beats at its
 * home, attaches over `GET /agent/ws`, and hands out each turn's request as a {@link Turn} to
 * answer chunk by chunk, and the clients' end-turn, cancel and close.
 * @module
 */

import { backoffDelay, sleep } from "./backoff.js";
import type { Client } from "./client.js";
import { EvmeshError, asEvmeshError } from "./errors.js";
import { asCloudEvent, extension, type CloudEvent } from "./event.js";
import { Feed } from "./feed.js";
import type { WsConn } from "./ws.js";

/** Options of {@link Agent.attach}. */
export interface AgentOptions {
  /** How often the agent heart-beats (default 10000: a third of the broker's `agent_heartbeat_timeout_ms` default, 30 s). */
  heartbeatMs?: number;
}

/** What an {@link Agent} is told: a turn to answer, a client's end-turn, cancel or close, or the broker's refusal of a chunk. */
export type AgentEvent =
  | { type: "turn"; turn: Turn }
  | { type: "end-turn"; sessionId: string; event: CloudEvent }
  | { type: "cancel"; sessionId: string; event: CloudEvent }
  | { type: "close"; sessionId: string; event: CloudEvent }
  | { type: "error"; sessionId: string | undefined; error: EvmeshError };

/** One turn of a session: the client's request, and the way to answer it chunk by chunk. */
export class Turn {
  private seq = 0;

  /** @internal */
  constructor(
    /** The request (`data` is the prompt; `emsessionid`, `emturn`, optional `emmodel`...). */
    readonly request: CloudEvent,
    /** The session. */
    readonly sessionId: string,
    /** The turn's number in its session (`emturn`), echoed in every chunk. */
    readonly turn: number | undefined,
    private readonly conn: WsConn,
  ) {}

  /** The prompt as text. */
  get prompt(): string {
    const d = this.request.data;
    if (typeof d === "string") return d;
    if (typeof this.request.data_base64 === "string") {
      try {
        return new TextDecoder().decode(Uint8Array.from(atob(this.request.data_base64), (c) => c.charCodeAt(0)));
      } catch {
        return "";
      }
    }
    return d === undefined ? "" : JSON.stringify(d);
  }

  private send(fields: Record<string, unknown>): void {
    const frame: Record<string, unknown> = { type: "chunk", sessionId: this.sessionId, seq: this.seq, ...fields };
    if (this.turn !== undefined) frame["turn"] = this.turn;
    this.seq += 1;
    if (!this.conn.send(JSON.stringify(frame))) {
      throw new EvmeshError({ kind: "disconnected", message: "the agent's connection ended" });
    }
  }

  /** Sends one piece of the answer (any JSON value). */
  chunk(data: unknown): void {
    this.send({ data, done: false });
  }

  /** Sends the last piece (none when `data` is absent) and ends the turn. */
  done(data?: unknown): void {
    this.send(data === undefined || data === null ? { done: true } : { data, done: true });
  }

  /** Ends the turn with an error. */
  fail(error: string): void {
    this.send({ error });
  }
}

/**
 * An agent of streaming calls (Mode 1): registered and heart-beating at its home, attached over
 * `GET /agent/ws`, an async iterable of {@link AgentEvent}s. It registers and attaches again by
 * itself when its connection drops (at once after a `1012`, "home moved").
 */
export class Agent extends Feed<AgentEvent> {
  private constructor(
    private readonly client: Client,
    /** The agent's id. */
    readonly agentId: string,
    private home: URL,
    private readonly heartbeatMs: number,
  ) {
    super();
    this.task = this.run().catch((e: unknown) => this.fatal(asEvmeshError(e, "protocol", "agent")));
  }

  /**
   * Registers agent `agentId` (following 307 to its home), heart-beats every `heartbeatMs`
   * there, and attaches in the background; watch {@link state} (or {@link onState}) for
   * `connected` before expecting turns.
   */
  static async attach(client: Client, agentId: string, options: AgentOptions = {}): Promise<Agent> {
    const home = await register(client, agentId);
    return new Agent(client, agentId, home, Math.max(100, options.heartbeatMs ?? 10_000));
  }

  private async run(): Promise<void> {
    const stop = this.stopCtl.signal;
    const beat = JSON.stringify({ agentId: this.agentId });
    // A failed beat is told by the WebSocket closing (forgotten, or home moved).
    const beats = setInterval(() => {
      void this.client
        .call(this.home, { method: "POST", path: "/agent/heartbeat", body: beat, headers: { "content-type": "application/json" }, signal: stop })
        .catch(() => undefined);
    }, this.heartbeatMs);
    try {
      let step = 0;
      let first = true;
      while (!stop.aborted) {
        this.cell.set({ kind: "connecting" });
        let reason: string;
        let immediate = false;
        try {
          if (!first) this.home = await register(this.client, this.agentId, stop);
          first = false;
          const { conn, url } = await this.client.websocket(this.home, `/agent/ws?${new URLSearchParams({ agentId: this.agentId })}`, stop);
          this.cell.set({ kind: "connected", url });
          step = 0;
          const end = await this.session(conn);
          if (end === undefined) break;
          reason = `closed ${end.code} ${end.reason}`.trimEnd();
          if (end.code === 1012) immediate = true;
          if (end.code === 1008 && end.reason === "token expired") immediate = await this.client.tokenRejected();
          if (end.code === 1008 && end.reason === "access revoked") {
            this.fatal(new EvmeshError({ kind: "closed", message: `closed by the broker: ${reason}`, closeCode: end.code, closeReason: end.reason }));
            return;
          }
        } catch (e) {
          if (stop.aborted) break;
          const err = asEvmeshError(e, "http", "agent");
          if (!err.transient) {
            this.fatal(err);
            return;
          }
          reason = err.message;
        }
        let delay = 0;
        if (!immediate) {
          delay = backoffDelay(this.client.backoff, step);
          step += 1;
        }
        this.cell.set({ kind: "disconnected", reason, retryInMs: delay });
        if (!(await sleep(delay, stop))) break;
      }
      this.cell.set({ kind: "closed", reason: "closed by the client" });
      this.out.end();
    } finally {
      clearInterval(beats);
    }
  }

  /** Reads one connection; `undefined` when the agent was closed, else the close. */
  private async session(conn: WsConn): Promise<{ code: number; reason: string } | undefined> {
    const stop = this.stopCtl.signal;
    const onStop = (): void => void conn.close(1000, "", 2000).then(() => conn.interrupt("closed by the client"));
    stop.addEventListener("abort", onStop, { once: true });
    try {
      if (stop.aborted) onStop();
      for (;;) {
        const m = await conn.next();
        if (stop.aborted) {
          await conn.close(1000, "", 2000);
          return undefined;
        }
        if (m.kind === "close") return { code: m.code, reason: m.reason };
        if (m.kind !== "text") continue;
        const ev = agentEvent(m.data, conn);
        if (ev !== undefined) this.out.push(ev);
      }
    } finally {
      stop.removeEventListener("abort", onStop);
    }
  }
}

/** Registers (following 307 to the agent's home); returns the home. */
async function register(client: Client, agentId: string, signal?: AbortSignal): Promise<URL> {
  const c = { method: "POST" as const, path: "/agent/register", body: JSON.stringify({ agentId }), headers: { "content-type": "application/json" } };
  const a = await client.call(undefined, signal === undefined ? c : { ...c, signal });
  return new URL("/", a.url);
}

/** What a text frame to an agent says: a turn's request, a client's control, or a refusal of a chunk (`undefined`: nothing to tell). */
function agentEvent(text: string, conn: WsConn): AgentEvent | undefined {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  const event = asCloudEvent(v);
  if (event === undefined) {
    // Answers to chunks (`{"type":"error",...}`) are not events.
    const o = v !== null && typeof v === "object" ? (v as Record<string, unknown>) : {};
    if (o["type"] === "error" && typeof o["status"] === "number") {
      return { type: "error", sessionId: typeof o["id"] === "string" ? o["id"] : undefined, error: EvmeshError.fromAnswer(o["status"], undefined, text) };
    }
    return undefined;
  }
  const sessionId = extension(event, "emsessionid") ?? "";
  switch (event.type) {
    case "evmesh.stream.request": {
      const t = Number(extension(event, "emturn"));
      return { type: "turn", turn: new Turn(event, sessionId, Number.isInteger(t) && extension(event, "emturn") !== undefined ? t : undefined, conn) };
    }
    case "evmesh.stream.end-turn":
      return { type: "end-turn", sessionId, event };
    case "evmesh.stream.cancel":
      return { type: "cancel", sessionId, event };
    case "evmesh.stream.close":
      return { type: "close", sessionId, event };
    default:
      return undefined;
  }
}
