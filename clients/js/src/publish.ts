/**
 * Publishing: one event or a batch over `POST /events/publish`, and a pipelined
 * {@link Publisher} over `GET /events/ws?publish=T` that keeps up to `maxInFlight` events
 * unanswered and hands each its own result.
 * @module
 */

import type { Conn } from "./conn.js";
import { EvmeshError } from "./errors.js";
import { checkEvent, toBinary, toJson, type CloudEvent, type ContentMode } from "./event.js";
import type { WsConn } from "./ws.js";

/** Where a published event was stored. */
export interface Published {
  /** The partition. */
  partition: number;
  /** The offset in that partition (exact up to 2^53). */
  offset: number;
  /** The topic it went to, when a route moved it elsewhere. */
  topic?: string;
}

/** Options of {@link Client.publish}. */
export interface PublishOptions {
  /** `structured` (`application/cloudevents+json`, the default) or `binary` (`ce-*` headers). */
  mode?: ContentMode;
}

/** Options of {@link Client.publisher}. */
export interface PublisherOptions {
  /** How many events may be sent and unanswered at once (default 256); more wait in order. */
  maxInFlight?: number;
}

/** A {@link Published} from an answer's JSON (offsets as numbers or strings). @internal */
export function asPublished(v: unknown): Published {
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    const partition = Number(o["partition"]);
    const offset = typeof o["offset"] === "string" || typeof o["offset"] === "number" ? Number(o["offset"]) : NaN;
    if (Number.isInteger(partition) && Number.isInteger(offset)) {
      const p: Published = { partition, offset };
      if (typeof o["topic"] === "string") p.topic = o["topic"];
      return p;
    }
  }
  throw new EvmeshError({ kind: "protocol", message: `not a publish result: ${JSON.stringify(v)?.slice(0, 200)}` });
}

/** `path?topic=T`. */
function publishPath(topic: string): string {
  return `/events/publish?${new URLSearchParams({ topic })}`;
}

/** {@link Client.publish}. @internal */
export async function publish(client: Conn, topic: string, event: CloudEvent, options: PublishOptions): Promise<Published> {
  if (options.mode === "binary") {
    const { headers, body } = toBinary(event);
    return asPublished(await client.json(undefined, { method: "POST", path: publishPath(topic), body, headers }));
  }
  const body = toJson(event);
  const headers = { "content-type": "application/cloudevents+json" };
  return asPublished(await client.json(undefined, { method: "POST", path: publishPath(topic), body, headers }));
}

/** {@link Client.publishBatch}. @internal */
export async function publishBatch(client: Conn, topic: string, events: CloudEvent[]): Promise<Published[]> {
  events.forEach(checkEvent);
  const headers = { "content-type": "application/cloudevents-batch+json" };
  const a = await client.json<{ results?: unknown }>(undefined, { method: "POST", path: publishPath(topic), body: JSON.stringify(events), headers });
  if (a === null || typeof a !== "object" || !Array.isArray(a.results)) {
    throw new EvmeshError({ kind: "protocol", message: "a batch answer without results" });
  }
  return a.results.map(asPublished);
}

/** {@link Client.publisher}. @internal */
export async function openPublisher(client: Conn, topic: string, options: PublisherOptions): Promise<Publisher> {
  const path = `/events/ws?${new URLSearchParams({ publish: topic })}`;
  const { conn } = await client.websocket(undefined, path);
  return new Publisher(conn, Math.max(1, Math.floor(options.maxInFlight ?? 256)));
}

/** One event waiting to be written or answered. */
interface Pending {
  id: string;
  json: string;
  resolve: (p: Published) => void;
  reject: (e: EvmeshError) => void;
}

/**
 * Publishes over one WebSocket without waiting for each answer: {@link send} resolves with
 * the event's own result (the broker answers in order), while up to `maxInFlight` events are
 * on the wire at once; further sends wait their turn in order. When the connection is lost,
 * every unanswered event's promise rejects with a `disconnected` {@link EvmeshError} (it may or
 * may not have been stored) and later sends do the same: make a new publisher.
 */
export class Publisher {
  private readonly inFlight: Pending[] = [];
  private readonly queued: Pending[] = [];
  private ended: EvmeshError | undefined;
  private readonly idleWaiters: Array<() => void> = [];
  private readonly roomWaiters: Array<() => void> = [];
  private readonly done: Promise<void>;

  /** @internal */
  constructor(
    private readonly conn: WsConn,
    /** How many events may be unanswered at once. */
    readonly maxInFlight: number,
  ) {
    this.done = this.read();
  }

  /** Sends `event`; resolves with where it was stored, rejects with the broker's refusal or a lost connection. */
  send(event: CloudEvent): Promise<Published> {
    let json: string;
    try {
      json = toJson(event);
    } catch (e) {
      return Promise.reject(e);
    }
    if (this.ended !== undefined) return Promise.reject(this.ended);
    return new Promise<Published>((resolve, reject) => {
      this.queued.push({ id: event.id, json, resolve, reject });
      this.pump();
    });
  }

  /** Resolves once fewer than `maxInFlight` events are on the wire and none wait (backpressure for a producer loop). */
  ready(): Promise<void> {
    if (this.ended !== undefined || (this.queued.length === 0 && this.inFlight.length < this.maxInFlight)) return Promise.resolve();
    return new Promise((resolve) => this.roomWaiters.push(resolve));
  }

  /** Resolves once every event sent so far is answered (each promise settles with its own result) or the connection is gone. */
  flush(): Promise<void> {
    if (this.ended !== undefined || (this.inFlight.length === 0 && this.queued.length === 0)) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Waits for what is owed ({@link flush}), then closes the connection. */
  async close(): Promise<void> {
    await this.flush();
    this.end(new EvmeshError({ kind: "disconnected", message: "the publisher was closed" }));
    await this.conn.close();
    await this.done;
  }

  /** Writes queued events while there is room. */
  private pump(): void {
    while (this.ended === undefined && this.inFlight.length < this.maxInFlight) {
      const next = this.queued.shift();
      if (next === undefined) break;
      if (!this.conn.send(next.json)) {
        next.reject(new EvmeshError({ kind: "disconnected", message: "the publisher's connection ended" }));
        this.end(new EvmeshError({ kind: "disconnected", message: "the publisher's connection ended" }));
        return;
      }
      this.inFlight.push(next);
    }
    this.wake();
  }

  private wake(): void {
    if (this.queued.length === 0 && this.inFlight.length < this.maxInFlight) for (const w of this.roomWaiters.splice(0)) w();
    if (this.queued.length === 0 && this.inFlight.length === 0) for (const w of this.idleWaiters.splice(0)) w();
  }

  /** Matches each answer to the oldest unanswered event of its id (the broker answers in order). */
  private async read(): Promise<void> {
    for (;;) {
      const m = await this.conn.next();
      if (m.kind === "close") {
        this.end(new EvmeshError({ kind: "disconnected", message: `the publisher's connection closed (${m.code}${m.reason ? ` ${m.reason}` : ""})` }));
        return;
      }
      if (m.kind !== "text") continue;
      let v: unknown;
      try {
        v = JSON.parse(m.data);
      } catch {
        v = undefined;
      }
      if (v === null || typeof v !== "object" || Array.isArray(v)) {
        this.end(new EvmeshError({ kind: "protocol", message: `the broker answered with something not a JSON object: ${m.data.slice(0, 200)}` }));
        await this.conn.close(1002, "not JSON", 500);
        return;
      }
      const o = v as Record<string, unknown>;
      const at = this.inFlight.findIndex((p) => p.id === o["id"]);
      const [p] = this.inFlight.splice(at < 0 ? 0 : at, 1);
      if (p === undefined) continue;
      if (o["type"] === "published") {
        try {
          p.resolve(asPublished(o));
        } catch (e) {
          p.reject(e as EvmeshError);
        }
      } else {
        const status = typeof o["status"] === "number" ? o["status"] : 500;
        p.reject(EvmeshError.fromAnswer(status, undefined, m.data));
      }
      this.pump();
    }
  }

  /** Rejects everything owed with `e`; later sends reject with it too. */
  private end(e: EvmeshError): void {
    if (this.ended !== undefined) return;
    this.ended = e;
    for (const p of this.inFlight.splice(0)) p.reject(e);
    for (const p of this.queued.splice(0)) p.reject(e);
    for (const w of this.roomWaiters.splice(0)) w();
    for (const w of this.idleWaiters.splice(0)) w();
  }
}
