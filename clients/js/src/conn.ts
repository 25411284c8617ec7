/**
 * What the parts of the client (consumers, publishers, sessions...) need of a {@link Client}:
 * the one request path and the WebSocket handshake. The parts depend on this, not on the
 * `Client` class, which depends on them. @internal
 * @module
 */

import type { Backoff } from "./backoff.js";
import type { WsConn } from "./ws.js";

/** A request for {@link Client.call} and {@link Client.open}. @internal */
export interface Call {
  /** The HTTP method. */
  method: "GET" | "POST";
  /** The path with its query, relative to the base URL. */
  path: string;
  /** The body, sent again as is after a redirect or a refreshed token. */
  body?: string | Uint8Array<ArrayBuffer>;
  /** Further headers (lowercase names). */
  headers?: Record<string, string>;
  /** The whole call's limit for {@link Client.call} (default the client's timeout). */
  timeoutMs?: number;
  /** Aborts the call (and a stream's body). Pass one per stream: {@link Client.open} listens on it for the stream's life. */
  signal?: AbortSignal;
}

/** An answer with a 2xx status, its body read. @internal */
export interface Answer {
  /** The status. */
  status: number;
  /** The body as text. */
  text: string;
  /** The URL that answered (after redirects). */
  url: string;
}

/** An answer with a 2xx status, its body unread (a stream's). @internal */
export interface Opened {
  /** The response. */
  response: Response;
  /** The URL that answered (after redirects). */
  url: string;
}

/** The request path of a client, as its parts use it. @internal */
export interface Conn {
  /** The broker URLs: the first given, then the fallbacks. */
  readonly seeds: readonly URL[];
  /** The reconnect delays. */
  readonly backoff: Backoff;
  /** The limit for one request (ms). */
  readonly timeoutMs: number;
  /** Sends a call and reads the whole answer. */
  call(base: string | URL | undefined, c: Call): Promise<Answer>;
  /** Sends a call and reads its answer as JSON. */
  json<T>(base: string | URL | undefined, c: Call): Promise<T>;
  /** Sends a call and returns a 2xx answer unread (a stream's). */
  open(base: string | URL | undefined, c: Call, headerTimeoutMs?: number): Promise<Opened>;
  /** Opens a WebSocket at `path` of `base`. */
  websocket(base: string | URL | undefined, path: string, signal?: AbortSignal): Promise<{ conn: WsConn; url: string }>;
  /** After a session ended for an expired token: whether a new token was fetched. */
  tokenRejected(): Promise<boolean>;
  /** Whether moving to `home` keeps TLS. */
  keepsTls(home: URL, base?: URL): boolean;
}

/** Aborts `to` when `from` aborts; returns the undo. @internal */
export function link(from: AbortSignal | undefined, to: AbortController): () => void {
  if (from === undefined) return () => {};
  if (from.aborted) {
    to.abort();
    return () => {};
  }
  const onAbort = (): void => to.abort();
  from.addEventListener("abort", onAbort, { once: true });
  return () => from.removeEventListener("abort", onAbort);
}
