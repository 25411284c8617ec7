/**
 * The one error type of the client. A refusal by the broker carries its problem+json body
 * (RFC 9457); everything else says which layer failed through {@link EvmeshError.kind}.
 * @module
 */

/** Which layer an {@link EvmeshError} comes from. */
export type ErrorKind =
  /** The broker answered with an error status (`status`, `title`, `detail`, `problem`). */
  | "api"
  /** The HTTP request could not be made or its answer not read (refused, reset, DNS...). */
  | "http"
  /** The WebSocket could not be opened or broke. */
  | "websocket"
  /** The broker closed a WebSocket session (`closeCode`, `closeReason`). */
  | "closed"
  /** No answer within the configured timeout. */
  | "timeout"
  /** A redirect the client refuses to follow (https to http, too many, no location). */
  | "redirect"
  /** The token refresh callback failed. */
  | "token"
  /** The broker's answer was not what the contract says. */
  | "protocol"
  /** A URL, option or argument given to the client is unusable. */
  | "config"
  /** The connection (or the publisher, consumer, agent) is gone or was closed. */
  | "disconnected";

/** What an {@link EvmeshError} is made from; every field but `kind` and `message` is optional. */
export interface EvmeshErrorInit {
  /** The layer that failed. */
  kind: ErrorKind;
  /** A sentence saying what went wrong. */
  message: string;
  /** The HTTP status of a refusal. */
  status?: number;
  /** The problem's `title`. */
  title?: string;
  /** The problem's `detail`. */
  detail?: string;
  /** The problem's `type` URI. */
  type?: string;
  /** `Retry-After`, in milliseconds. */
  retryAfterMs?: number;
  /** The refusal's body (parsed JSON, or `{detail: text}` for text, or `null`). */
  problem?: unknown;
  /** The RFC 6455 close code of a closed session. */
  closeCode?: number;
  /** The close frame's reason. */
  closeReason?: string;
  /** The underlying error. */
  cause?: unknown;
}

/** Reason phrases of the statuses a broker (or a proxy in front of it) answers with. */
const REASONS: Readonly<Record<number, string>> = {
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  408: "Request Timeout",
  409: "Conflict",
  413: "Content Too Large",
  415: "Unsupported Media Type",
  426: "Upgrade Required",
  429: "Too Many Requests",
  431: "Request Header Fields Too Large",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
};

/** The longest text body kept as a problem's `detail` (an HTML error page is not a detail). */
const MAX_TEXT_DETAIL = 512;

/**
 * Every failure of the client. A refusal by the broker (`kind === "api"`) has its HTTP
 * `status`, the problem+json `title` and `detail`, `retryAfterMs` from `Retry-After`, and the
 * whole body as `problem`; a body that is not JSON (a proxy's HTML page) becomes the `detail`,
 * shortened.
 */
export class EvmeshError extends Error {
  /** The layer that failed. */
  readonly kind: ErrorKind;
  /** The HTTP status of a refusal (`kind === "api"`). */
  readonly status: number | undefined;
  /** The problem's `title` (the status's reason phrase when the body has none). */
  readonly title: string | undefined;
  /** The problem's `detail`: what exactly was wrong. */
  readonly detail: string | undefined;
  /** The problem's `type`, a URI naming the kind of problem. */
  readonly type: string | undefined;
  /** `Retry-After` (seconds on the wire), in milliseconds. */
  readonly retryAfterMs: number | undefined;
  /** The refusal's whole body: its JSON (extension members included), `{detail}` for text, else `null`. */
  readonly problem: unknown;
  /** The RFC 6455 close code when the broker closed a session (1008 token expired / access revoked, 1012 home moved). */
  readonly closeCode: number | undefined;
  /** The close frame's reason. */
  readonly closeReason: string | undefined;

  /** An error of `init.kind`; see {@link EvmeshErrorInit}. */
  constructor(init: EvmeshErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "EvmeshError";
    this.kind = init.kind;
    this.status = init.status;
    this.title = init.title;
    this.detail = init.detail;
    this.type = init.type;
    this.retryAfterMs = init.retryAfterMs;
    this.problem = init.problem ?? null;
    this.closeCode = init.closeCode;
    this.closeReason = init.closeReason;
  }

  /**
   * Whether trying again later may succeed: connection failures, timeouts, sessions closed
   * for another reason than policy (1008), and the statuses that say so (408, 429, 502, 503, 504).
   */
  get transient(): boolean {
    switch (this.kind) {
      case "api":
        return this.status === 408 || this.status === 429 || (this.status !== undefined && this.status >= 502 && this.status <= 504);
      case "http":
      case "websocket":
      case "timeout":
      case "disconnected":
        return true;
      case "closed":
        return this.closeCode !== 1008;
      default:
        return false;
    }
  }

  /**
   * A refusal from its status, `Retry-After` header value and body text. Never throws,
   * whatever the body is.
   */
  static fromAnswer(status: number, retryAfter: string | null | undefined, body: string): EvmeshError {
    let problem: unknown = null;
    const text = body.trim();
    if (text !== "") {
      try {
        problem = JSON.parse(text);
      } catch {
        problem = { detail: text.length > MAX_TEXT_DETAIL ? `${text.slice(0, MAX_TEXT_DETAIL)}...` : text };
      }
    }
    const field = (k: string): string | undefined => {
      if (problem !== null && typeof problem === "object" && !Array.isArray(problem)) {
        const v = (problem as Record<string, unknown>)[k];
        return typeof v === "string" ? v : undefined;
      }
      return undefined;
    };
    const title = field("title") ?? REASONS[status] ?? "Error";
    const detail = field("detail");
    const init: EvmeshErrorInit = {
      kind: "api",
      message: detail === undefined ? `${status} ${title}` : `${status} ${title}: ${detail}`,
      status,
      title,
      problem,
    };
    if (detail !== undefined) init.detail = detail;
    const type = field("type");
    if (type !== undefined) init.type = type;
    const after = parseRetryAfter(retryAfter);
    if (after !== undefined) init.retryAfterMs = after;
    return new EvmeshError(init);
  }
}

/** `Retry-After` in milliseconds: delta-seconds, or an HTTP date. */
function parseRetryAfter(value: string | null | undefined): number | undefined {
  if (value === null || value === undefined) return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** `e` as an {@link EvmeshError}: itself, or wrapped as `kind` with `what` in front. */
export function asEvmeshError(e: unknown, kind: ErrorKind, what: string): EvmeshError {
  if (e instanceof EvmeshError) return e;
  const message = e instanceof Error ? e.message : String(e);
  return new EvmeshError({ kind, message: `${what}: ${message}`, cause: e });
}
