/**
 * The WebSocket the client uses: the platform's (`globalThis.WebSocket`: browsers, Node 22+,
 * Deno, Bun) or one given as `options.WebSocket` (Node 20: the `ws` package), behind a small
 * reader that hands out messages in order.
 * @module
 */

import { EvmeshError } from "./errors.js";

/** What the client needs of a WebSocket event (open, message, close or error). */
export interface WebSocketEventLike {
  /** A message's payload: a string for a text frame. */
  readonly data?: unknown;
  /** A close event's code. */
  readonly code?: number;
  /** A close event's reason. */
  readonly reason?: string;
}

/** What the client needs of a WebSocket object: the WHATWG `WebSocket` interface, in part. */
export interface WebSocketLike {
  /** 0 connecting, 1 open, 2 closing, 3 closed. */
  readonly readyState: number;
  /** Bytes queued by `send` and not yet written. */
  readonly bufferedAmount: number;
  /** Sends a text frame. */
  send(data: string): void;
  /** Starts the closing handshake. */
  close(code?: number, reason?: string): void;
  /** Listens for `open`, `message`, `close` and `error`. */
  addEventListener(type: "open" | "message" | "close" | "error", listener: (event: WebSocketEventLike) => void): void;
}

/** A WebSocket constructor: `globalThis.WebSocket`, or the `ws` package's `WebSocket`. */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;

/** One message read from a {@link WsConn}. @internal */
export type WsMessage =
  | { kind: "text"; data: string }
  | { kind: "binary" }
  | { kind: "close"; code: number; reason: string };

/**
 * The WebSocket constructor to use: `given`, else `globalThis.WebSocket`; a `config` error
 * naming the option when there is neither.
 * @internal
 */
export function webSocketConstructor(given: WebSocketConstructor | undefined): WebSocketConstructor {
  if (given !== undefined) return given;
  const g = (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
  if (typeof g === "function") return g;
  throw new EvmeshError({
    kind: "config",
    message:
      "no WebSocket: this platform has no globalThis.WebSocket (Node 20); pass one as " +
      "new Client(url, { WebSocket }) (e.g. the ws package's), or run Node 22+ or Node 20.10+ with --experimental-websocket",
  });
}

/**
 * An open WebSocket read message by message.
 * @internal
 */
export class WsConn {
  private readonly queue: WsMessage[] = [];
  private waiter: ((m: WsMessage) => void) | undefined;
  private ended: WsMessage | undefined;
  private readonly closedWaiters: Array<() => void> = [];

  private constructor(private readonly socket: WebSocketLike) {}

  /**
   * Opens `url`; rejects with a `websocket` (or `timeout`) error when the handshake fails or
   * takes longer than `timeoutMs`.
   */
  static open(ctor: WebSocketConstructor, url: string, protocols: string[], timeoutMs: number, signal?: AbortSignal): Promise<WsConn> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted === true) {
        reject(new EvmeshError({ kind: "disconnected", message: `WebSocket ${redact(url)}: aborted` }));
        return;
      }
      let socket: WebSocketLike;
      try {
        socket = new ctor(url, protocols);
      } catch (e) {
        reject(new EvmeshError({ kind: "config", message: `WebSocket ${redact(url)}: ${String(e)}`, cause: e }));
        return;
      }
      const conn = new WsConn(socket);
      let settled = false;
      const giveUp = (e: EvmeshError): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        try {
          socket.close();
        } catch {
          // Closing a socket that never opened may throw; it is dropped either way.
        }
        reject(e);
      };
      const onAbort = (): void => giveUp(new EvmeshError({ kind: "disconnected", message: `WebSocket ${redact(url)}: aborted` }));
      const timer = setTimeout(
        () => giveUp(new EvmeshError({ kind: "timeout", message: `WebSocket handshake with ${redact(url)}: no answer within ${timeoutMs} ms` })),
        timeoutMs,
      );
      signal?.addEventListener("abort", onAbort, { once: true });
      socket.addEventListener("open", () => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        resolve(conn);
      });
      socket.addEventListener("error", (ev) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        const detail = (ev as { message?: unknown }).message;
        const why = typeof detail === "string" && detail !== "" ? `: ${detail}` : "";
        reject(new EvmeshError({ kind: "websocket", message: `WebSocket handshake with ${redact(url)} failed${why}` }));
      });
      socket.addEventListener("message", (ev) => {
        conn.push(typeof ev.data === "string" ? { kind: "text", data: ev.data } : { kind: "binary" });
      });
      socket.addEventListener("close", (ev) => {
        const m: WsMessage = { kind: "close", code: typeof ev.code === "number" ? ev.code : 1005, reason: typeof ev.reason === "string" ? ev.reason : "" };
        if (conn.ended === undefined) {
          conn.ended = m;
          conn.push(m);
        }
        for (const w of conn.closedWaiters.splice(0)) w();
        if (!settled) {
          settled = true;
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          reject(new EvmeshError({ kind: "websocket", message: `WebSocket handshake with ${redact(url)} failed (closed ${m.code})` }));
        }
      });
    });
  }

  private push(m: WsMessage): void {
    const w = this.waiter;
    if (w !== undefined) {
      this.waiter = undefined;
      w(m);
    } else {
      this.queue.push(m);
    }
  }

  /** The next message; after the close, the close again and again. */
  next(): Promise<WsMessage> {
    const m = this.queue.shift();
    if (m !== undefined) return Promise.resolve(m);
    if (this.ended !== undefined) return Promise.resolve(this.ended);
    return new Promise((resolve) => {
      this.waiter = resolve;
    });
  }

  /** Wakes the reader with a close of our own (the peer never answered ours). */
  interrupt(reason: string): void {
    if (this.ended !== undefined) return;
    const m: WsMessage = { kind: "close", code: 1006, reason };
    this.ended = m;
    this.push(m);
    for (const w of this.closedWaiters.splice(0)) w();
  }

  /** Whether the socket is open for sending. */
  get open(): boolean {
    return this.socket.readyState === 1;
  }

  /** Bytes queued for sending. */
  get bufferedAmount(): number {
    return this.socket.bufferedAmount;
  }

  /** Sends a text frame; `false` when the socket is not open (nothing sent). */
  send(text: string): boolean {
    if (this.socket.readyState !== 1) return false;
    try {
      this.socket.send(text);
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Closes (what was sent before goes out first) and waits up to `waitMs` for the peer's
   * close, so the broker reads what was sent before it sees the socket go.
   */
  async close(code = 1000, reason = "", waitMs = 2000): Promise<void> {
    if (this.ended !== undefined) return;
    try {
      this.socket.close(code, reason);
    } catch {
      // Already closing.
    }
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, waitMs);
      this.closedWaiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }
}

/** `url` without its `access_token`, for messages. @internal */
export function redact(url: string): string {
  return url.replace(/([?&]access_token=)[^&]*/, "$1<redacted>");
}
