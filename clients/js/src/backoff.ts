/**
 * Reconnect delays: exponential with full jitter (`min + random(0, min(max, min * 2^step))`,
 * capped at `max`), so a broker restart is not met by every client at the same instant.
 * @module
 */

/** The delays between reconnect attempts, in milliseconds. */
export interface Backoff {
  /** The first delay and the least (default 500). */
  minMs: number;
  /** The greatest delay (default 20000). */
  maxMs: number;
}

/** 0.5 s to 20 s, as the Rust client and `evmesh sub`. */
export const DEFAULT_BACKOFF: Readonly<Backoff> = Object.freeze({ minMs: 500, maxMs: 20_000 });

/** The delay before attempt `step` (0 for the first retry), in milliseconds. */
export function backoffDelay(backoff: Backoff, step: number): number {
  const min = Math.max(0, backoff.minMs);
  const max = Math.max(min, backoff.maxMs);
  const ceiling = Math.min(max, min * 2 ** Math.min(Math.max(0, step), 31));
  const jitter = Math.floor(Math.random() * (ceiling + 1));
  return Math.min(max, min + jitter);
}

/**
 * Waits `ms` milliseconds; `false` when `signal` aborted first (at once if it already had).
 * @internal
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve(false);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
