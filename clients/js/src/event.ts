/**
 * CloudEvents on the wire, in the HTTP binding's content modes (structured JSON, binary `ce-*`
 * headers, batch), as plain objects.
 * @module
 */

import { EvmeshError } from "./errors.js";

/** The value of a CloudEvents extension attribute. */
export type ExtensionValue = string | number | boolean;

/**
 * A CloudEvent (spec 1.0) in its structured JSON form. Extension attributes are further keys
 * (names `[a-z0-9]+`) whose values are strings, numbers or booleans; events the broker delivers
 * carry `emdeliveryid`, `empartition`, `emoffset`, `emattempt` and friends.
 */
export interface CloudEvent {
  /** Always `"1.0"`. */
  specversion: "1.0";
  /** Unique per `source`; what consumers dedupe on. */
  id: string;
  /** A URI reference naming where the event happened. */
  source: string;
  /** The kind of event, e.g. `com.shop.order.created`. */
  type: string;
  /** The media type of `data` (JSON when absent and `data` is not a string). */
  datacontenttype?: string | null;
  /** A URI naming the schema `data` adheres to. */
  dataschema?: string | null;
  /** What in `source` the event is about. */
  subject?: string | null;
  /** When it happened, RFC 3339. */
  time?: string | null;
  /** The payload: any JSON value (or text for a non-JSON `datacontenttype`). */
  data?: unknown;
  /** A binary payload, base64 (instead of `data`). */
  data_base64?: string | null;
  /** Extension attributes (string, number or boolean values). */
  [extension: string]: unknown;
}

/** How {@link Client.publish} sends a single event. */
export type ContentMode = "structured" | "binary";

/** The attributes that are not `ce-*` headers in binary mode. */
const NOT_HEADERS = new Set(["data", "data_base64", "datacontenttype"]);

/** Whether `ct` names JSON (`application/json`, `text/json`, `*+json`). */
function isJson(ct: string | undefined): boolean {
  if (ct === undefined) return true;
  const base = (ct.split(";")[0] ?? "").trim().toLowerCase();
  return base === "application/json" || base === "text/json" || base.endsWith("+json");
}

/**
 * The headers and body of `event` in binary mode. Header values are percent-encoded as the HTTP
 * binding asks (space, `"`, `%` and anything outside printable ASCII).
 */
export function toBinary(event: CloudEvent): { headers: Record<string, string>; body: Uint8Array<ArrayBuffer> } {
  checkEvent(event);
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(event)) {
    if (NOT_HEADERS.has(name) || value === undefined || value === null) continue;
    if (typeof value === "object") {
      throw new EvmeshError({ kind: "config", message: `attribute ${name}: an object cannot be a CloudEvents attribute` });
    }
    headers[`ce-${name}`] = percentEncode(String(value));
  }
  const ct = event.datacontenttype ?? undefined;
  let body: Uint8Array<ArrayBuffer> = new Uint8Array(0);
  let contentType: string | undefined = ct;
  if (typeof event.data_base64 === "string") {
    body = fromBase64(event.data_base64);
    contentType ??= "application/octet-stream";
  } else if (event.data instanceof Uint8Array) {
    body = new Uint8Array(event.data);
    contentType ??= "application/octet-stream";
  } else if (event.data !== undefined) {
    if (typeof event.data === "string" && !(ct !== undefined && isJson(ct))) {
      body = new TextEncoder().encode(event.data);
      contentType ??= "text/plain; charset=utf-8";
    } else if (isJson(ct)) {
      body = new TextEncoder().encode(JSON.stringify(event.data));
      contentType ??= "application/json";
    } else {
      throw new EvmeshError({ kind: "config", message: `data of type ${ct ?? ""} must be a string or a Uint8Array` });
    }
  }
  if (contentType !== undefined) headers["content-type"] = contentType;
  return { headers, body };
}

/** `s` with what a header value may not hold percent-encoded (UTF-8 bytes). */
export function percentEncode(s: string): string {
  let out = "";
  for (const b of new TextEncoder().encode(s)) {
    if (b >= 0x21 && b <= 0x7e && b !== 0x22 && b !== 0x25) out += String.fromCharCode(b);
    else out += `%${b.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

function fromBase64(s: string): Uint8Array<ArrayBuffer> {
  try {
    const bin = atob(s);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  } catch (e) {
    throw new EvmeshError({ kind: "config", message: "data_base64 is not base64", cause: e });
  }
}

/** Throws a `config` error unless `event` has the required attributes. */
export function checkEvent(event: CloudEvent): void {
  if (event === null || typeof event !== "object" || Array.isArray(event)) {
    throw new EvmeshError({ kind: "config", message: "an event must be an object" });
  }
  for (const k of ["specversion", "id", "source", "type"] as const) {
    if (typeof event[k] !== "string" || event[k] === "") {
      throw new EvmeshError({ kind: "config", message: `an event needs a string ${k}` });
    }
  }
}

/** The structured-mode JSON of `event`. */
export function toJson(event: CloudEvent): string {
  checkEvent(event);
  return JSON.stringify(event);
}

/**
 * A CloudEvent from a parsed JSON value, or `undefined` when the value is not one (not an
 * object, or without a string `specversion`, `id`, `source`, `type`).
 */
export function asCloudEvent(value: unknown): CloudEvent | undefined {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return undefined;
  const v = value as Record<string, unknown>;
  for (const k of ["specversion", "id", "source", "type"]) {
    if (typeof v[k] !== "string") return undefined;
  }
  return v as CloudEvent;
}

/** An event from its structured-mode JSON text; a `protocol` error when it is not one. */
export function parseEvent(text: string): CloudEvent {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new EvmeshError({ kind: "protocol", message: `not a structured CloudEvent (not JSON): ${short(text)}`, cause: e });
  }
  const ev = asCloudEvent(value);
  if (ev === undefined) throw new EvmeshError({ kind: "protocol", message: `not a structured CloudEvent: ${short(text)}` });
  return ev;
}

/** An extension of `event` as a string, whatever type it was carried as (`undefined` when absent). */
export function extension(event: CloudEvent, name: string): string | undefined {
  const v = event[name];
  if (typeof v === "string") return v;
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  return undefined;
}

/** The first 200 characters of `s`, for messages. @internal */
export function short(s: string): string {
  return s.length > 200 ? `${s.slice(0, 200)}...` : s;
}
