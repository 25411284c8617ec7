/**
 * `@evmesh/client`: publish, subscribe and consume CloudEvents on an evmesh broker over HTTP/1.1
 * and WebSocket, on the platform's own `fetch`, `WebSocket` and streams (no dependencies), with
 * the hard parts done once: acks and credit, reconnects with full-jitter backoff, asking
 * `GET /session/recommend` where a subscription lives (and again after a `1012`), redirects
 * (never from https to http), and tokens refreshed before they expire.
 *
 * ```ts
 * import { Client } from "@evmesh/client";
 * const client = new Client("http://127.0.0.1:8080");
 * await client.subscribe({ subscription: "billing", topic: "orders", start: "earliest" });
 * await client.publish("orders", { specversion: "1.0", id: "o-1", source: "/shop", type: "com.shop.order", data: { amount: 120 } });
 * for await (const d of client.consumer("billing")) {
 *   console.log(d.event.id, d.event.data);
 *   d.ack();
 * }
 * ```
 * @module
 */

export { DEFAULT_BACKOFF, backoffDelay, type Backoff } from "./backoff.js";
export { Client, type ClientOptions } from "./client.js";
export { Consumer, Delivery, type ConsumerOptions, type Transport } from "./consume.js";
export { EvmeshError, type ErrorKind, type EvmeshErrorInit } from "./errors.js";
export { extension, parseEvent, percentEncode, toBinary, toJson, type CloudEvent, type ContentMode, type ExtensionValue } from "./event.js";
export { Publisher, type Published, type PublishOptions, type PublisherOptions } from "./publish.js";
export type { ConnectionState } from "./queue.js";
export type { Handler } from "./request.js";
export { SseParser, type SseEvent } from "./sse.js";
export { Agent, Turn, type AgentEvent, type AgentOptions } from "./agent.js";
export { ChunkStream, Session, SessionPublisher, SessionSubscriber, Streaming, type Chunk, type ChunkKind } from "./streaming.js";
export type { Filter, Mode, Start, Subscribed, Subscription } from "./subscription.js";
export type { Token, TokenRefresh } from "./token.js";
export type { WebSocketConstructor, WebSocketEventLike, WebSocketLike } from "./ws.js";
