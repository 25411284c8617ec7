/**
 * Subscriptions: the definition a client sends to `POST /events/subscribe`, as a plain object.
 * @module
 */

import type { Conn } from "./conn.js";

/** How a subscription's events are shared among its attached sessions. */
export type Mode =
  /** Each event to exactly one session; partitions sticky to a session (the default). */
  | "LOAD_BALANCE"
  /** Every session (each `clientId` with its own offsets) gets every event. */
  | "BROADCAST"
  /** Every session whose own filter matches gets the event. */
  | "MULTICAST";

/** A CloudEvents Subscriptions API filter, or a CESQL 1.0 expression; a subscription's filters are ANDed. */
export type Filter =
  | { exact: Record<string, string> }
  | { prefix: Record<string, string> }
  | { suffix: Record<string, string> }
  | { all: Filter[] }
  | { any: Filter[] }
  | { not: Filter }
  | { sql: string };

/** Where a new consumer starts: new events only, everything stored, an offset of every partition, or the first event at or after an RFC 3339 time. */
export type Start = "latest" | "earliest" | { offset: number } | { time: string };

/** A subscription's definition (the JSON of `POST /events/subscribe`). */
export interface Subscription {
  /** Its name. */
  subscription: string;
  /** The topic it follows. */
  topic: string;
  /** How events are shared among sessions (default `LOAD_BALANCE`). */
  mode?: Mode;
  /** Filters, ANDed. */
  filters?: Filter[];
  /** Where a new consumer starts (default `latest`). */
  start?: Start;
  /** How long a delivery may stay unacknowledged before it is sent again (default 30000). */
  ackTimeoutMs?: number;
  /** How many deliveries an event gets before it is dead-lettered (default 6). */
  maxAttempts?: number;
  /** A webhook each event is pushed to (binary mode, signed) instead of waiting for sessions. */
  sink?: string;
  /** The HMAC key of the sink's `X-Em-Signature`. */
  sinkSecret?: string;
}

/** The broker's answer to {@link Client.subscribe}. */
export interface Subscribed {
  /** `true` when this call made the subscription (201), `false` when it existed as defined (200). */
  created: boolean;
  /** The subscription's home instance, where its sessions attach (many instances). */
  instanceUrl?: string;
}

/** {@link Client.subscribe}. @internal */
export async function subscribe(client: Conn, subscription: Subscription): Promise<Subscribed> {
  const a = await client.call(undefined, {
    method: "POST",
    path: "/events/subscribe",
    body: JSON.stringify(subscription),
    headers: { "content-type": "application/json" },
  });
  const out: Subscribed = { created: a.status === 201 };
  try {
    const v = JSON.parse(a.text) as { instanceUrl?: unknown };
    if (typeof v.instanceUrl === "string") out.instanceUrl = v.instanceUrl;
  } catch {
    // The status is the answer; the body is a courtesy.
  }
  return out;
}

/** {@link Client.unsubscribe}. @internal */
export async function unsubscribe(client: Conn, name: string): Promise<void> {
  await client.call(undefined, {
    method: "POST",
    path: "/events/unsubscribe",
    body: JSON.stringify({ subscription: name }),
    headers: { "content-type": "application/json" },
  });
}
