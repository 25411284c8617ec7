/**
 * Credentials: a static bearer token, or one a callback hands out and refreshes before it
 * expires and again when the broker answers 401 or closes a session with "token expired".
 * @module
 */

import { EvmeshError, asEvmeshError } from "./errors.js";

/** A bearer token and, if known, when it stops being valid. */
export interface Token {
  /** The token itself, sent as `Authorization: Bearer <value>` (and `?access_token=` on WebSockets). */
  value: string;
  /** When the broker stops accepting it (a JWT's `exp`); absent: never, as far as the client knows. */
  expiresAt?: Date;
}

/** A callback that fetches a new token (from an identity provider, a file, ...). */
export type TokenRefresh = () => Promise<Token>;

/**
 * The client's credential: the current token and, with a callback, how to get the next.
 * Concurrent refreshes share one call of the callback.
 * @internal
 */
export class Tokens {
  private current: Token | undefined;
  private pending: Promise<Token> | undefined;

  constructor(
    token: string | undefined,
    private readonly refreshFn: TokenRefresh | undefined,
    private readonly leadMs: number,
  ) {
    this.current = token === undefined ? undefined : { value: token };
  }

  /** The token to send now: the current one, or a fresh one when there is none yet or it expires within the lead time. */
  async get(): Promise<string | undefined> {
    const cur = this.current;
    const stale = cur === undefined || (cur.expiresAt !== undefined && cur.expiresAt.getTime() <= Date.now() + this.leadMs);
    if (stale && this.refreshFn !== undefined) {
      return (await this.fetch()).value;
    }
    return cur?.value;
  }

  /** The token held now, as it is (never refreshed here). */
  currentValue(): string | undefined {
    return this.current?.value;
  }

  /**
   * After a 401 or a session closed for an expired token: `true` once a new token is there,
   * `false` when there is no callback (the refusal stands). `rejected` is the token the broker
   * refused; when another caller refreshed it meanwhile the callback is not called again.
   */
  async refresh(rejected: string | undefined): Promise<boolean> {
    if (this.refreshFn === undefined) return false;
    if (this.current?.value !== rejected && this.current !== undefined) return true;
    await this.fetch();
    return true;
  }

  private fetch(): Promise<Token> {
    const fn = this.refreshFn;
    if (fn === undefined) return Promise.reject(new EvmeshError({ kind: "token", message: "no token refresh callback" }));
    if (this.pending === undefined) {
      this.pending = (async () => {
        try {
          const t = await fn();
          if (t === null || typeof t !== "object" || typeof t.value !== "string") {
            throw new EvmeshError({ kind: "token", message: "token refresh: the callback returned no {value}" });
          }
          this.current = t;
          return t;
        } catch (e) {
          throw asEvmeshError(e, "token", "token refresh");
        } finally {
          this.pending = undefined;
        }
      })();
    }
    return this.pending;
  }
}
