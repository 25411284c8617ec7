/**
 * Two small building blocks of the long-running parts (consumers, agents, session
 * subscribers): a queue read as an async iterator, and a connection state with listeners.
 * @module
 */

import type { EvmeshError } from "./errors.js";

/**
 * The connection of a consumer (or agent, or session subscriber), as it changes.
 * `connecting`: asking where to attach, or attaching; `connected`: attached at `url`;
 * `disconnected`: the session ended for `reason`, the next attempt is in `retryInMs`;
 * `closed`: given up for good (closed by the caller, or refused for a reason a retry cannot change).
 */
export type ConnectionState =
  | { kind: "connecting" }
  | { kind: "connected"; url: string }
  | { kind: "disconnected"; reason: string; retryInMs: number }
  | { kind: "closed"; reason: string };

/**
 * A queue of values read in order by one reader; it ends, or fails once (the reader gets the
 * error, then the end).
 * @internal
 */
export class AsyncQueue<T> {
  private readonly items: T[] = [];
  private readonly readers: Array<{ resolve: (r: IteratorResult<T, undefined>) => void; reject: (e: unknown) => void }> = [];
  private failure: EvmeshError | undefined;
  private ended = false;
  private roomWaiters: Array<{ limit: number; resolve: () => void }> = [];

  /** How many values wait to be read. */
  get size(): number {
    return this.items.length;
  }

  /** Whether the queue has ended (values may still wait to be read). */
  get closed(): boolean {
    return this.ended;
  }

  /** Adds a value; `false` once the queue has ended (the value is dropped). */
  push(value: T): boolean {
    if (this.ended) return false;
    const r = this.readers.shift();
    if (r !== undefined) r.resolve({ done: false, value });
    else this.items.push(value);
    return true;
  }

  /** Ends the queue after the values already in it. */
  end(): void {
    if (this.ended) return;
    this.ended = true;
    this.settleReaders();
    this.wakeWriters();
  }

  /** Ends the queue with `error`, which the reader gets (once) after the values already in it. */
  fail(error: EvmeshError): void {
    if (this.ended) return;
    this.failure = error;
    this.end();
  }

  /** Drops the values not read yet. */
  clear(): void {
    this.items.length = 0;
  }

  private settleReaders(): void {
    while (this.readers.length > 0 && this.items.length === 0) {
      const r = this.readers.shift();
      if (r === undefined) break;
      const f = this.failure;
      if (f !== undefined) {
        this.failure = undefined;
        r.reject(f);
      } else {
        r.resolve({ done: true, value: undefined });
      }
    }
  }

  /** Resolves once fewer than `limit` values wait (or the queue has ended): a writer's backpressure. */
  room(limit: number): Promise<void> {
    if (this.ended || this.items.length < limit) return Promise.resolve();
    return new Promise((resolve) => this.roomWaiters.push({ limit, resolve }));
  }

  private wakeWriters(): void {
    if (this.roomWaiters.length === 0) return;
    const keep: Array<{ limit: number; resolve: () => void }> = [];
    for (const w of this.roomWaiters) {
      if (this.ended || this.items.length < w.limit) w.resolve();
      else keep.push(w);
    }
    this.roomWaiters = keep;
  }

  /** The next value, the end, or the failure. */
  next(): Promise<IteratorResult<T, undefined>> {
    const value = this.items.shift();
    if (value !== undefined) {
      this.wakeWriters();
      return Promise.resolve({ done: false, value });
    }
    if (this.ended) {
      const f = this.failure;
      if (f !== undefined) {
        this.failure = undefined;
        return Promise.reject(f);
      }
      return Promise.resolve({ done: true, value: undefined });
    }
    return new Promise((resolve, reject) => this.readers.push({ resolve, reject }));
  }
}

/** A connection state and the listeners told of each change. @internal */
export class StateCell {
  private current: ConnectionState = { kind: "connecting" };
  private readonly listeners = new Set<(s: ConnectionState) => void>();

  /** The state now. */
  get value(): ConnectionState {
    return this.current;
  }

  /** Changes the state (a closed state stays closed) and tells every listener. */
  set(s: ConnectionState): void {
    if (this.current.kind === "closed") return;
    this.current = s;
    for (const l of [...this.listeners]) {
      try {
        l(s);
      } catch {
        // A listener's failure is its own.
      }
    }
  }

  /** Calls `listener` on every change from now on; returns the function that stops it. */
  on(listener: (s: ConnectionState) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
}
