/**
 * What a consumer, an agent and a session subscriber share: a queue of what they read, the
 * connection's state, and the background task that runs until they are closed.
 * @module
 */

import type { EvmeshError } from "./errors.js";
import { AsyncQueue, StateCell, type ConnectionState } from "./queue.js";

/** A stream of `T` fed by a background task that keeps a connection. @internal */
export abstract class Feed<T> implements AsyncIterable<T> {
  /** What the task read, for the user. */
  protected readonly out = new AsyncQueue<T>();
  /** The connection's state. */
  protected readonly cell = new StateCell();
  /** Aborted by {@link close}: the task winds down. */
  protected readonly stopCtl = new AbortController();
  /** The task; set by the subclass's constructor. */
  protected task: Promise<void> = Promise.resolve();

  /** The connection's state now. */
  get state(): ConnectionState {
    return this.cell.value;
  }

  /** Calls `listener` on every change of {@link state}; returns the function that stops it. */
  onState(listener: (state: ConnectionState) => void): () => void {
    return this.cell.on(listener);
  }

  /** Iterates; leaving the loop (`break`, `return`, a throw in its body) closes this as {@link close} does. */
  [Symbol.asyncIterator](): AsyncIterator<T, undefined> {
    return {
      next: () => this.out.next(),
      return: async () => {
        await this.close();
        return { done: true, value: undefined };
      },
    };
  }

  /** Stops: what was given (acks, chunks) goes out first, then the connection is closed. */
  async close(): Promise<void> {
    this.stopCtl.abort();
    await this.task;
  }

  /** Ends for good: the state says why, and the reader gets the error once. */
  protected fatal(e: EvmeshError): void {
    this.cell.set({ kind: "closed", reason: e.message });
    this.out.fail(e);
  }
}
