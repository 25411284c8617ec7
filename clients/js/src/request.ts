/**
 * Request-reply: {@link Client.request} publishes a request and waits for its reply; a
 * responder consumes requests through any subscription and answers each with
 * {@link Client.reply}, or lets {@link Client.serve} do both.
 * @module
 */

import type { Conn } from "./conn.js";
import type { Consumer, Delivery } from "./consume.js";
import { EvmeshError } from "./errors.js";
import { extension, parseEvent, toJson, type CloudEvent } from "./event.js";

/** A responder's handler: the answer to a request (or nothing, for an event that is not one). */
export type Handler = (event: CloudEvent, delivery: Delivery) => CloudEvent | undefined | null | Promise<CloudEvent | undefined | null>;

/** {@link Client.request}. @internal */
export async function request(client: Conn, topic: string, event: CloudEvent, timeoutMs: number): Promise<CloudEvent> {
  const ms = Math.max(1, Math.floor(timeoutMs));
  const a = await client.call(undefined, {
    method: "POST",
    path: `/events/request?${new URLSearchParams({ topic, timeoutMs: String(ms) })}`,
    body: toJson(event),
    headers: { "content-type": "application/cloudevents+json", accept: "application/cloudevents+json" },
    timeoutMs: ms + client.timeoutMs,
  });
  return parseEvent(a.text);
}

/** {@link Client.reply}. @internal */
export async function reply(client: Conn, requestEvent: CloudEvent, replyEvent: CloudEvent): Promise<void> {
  const id = extension(requestEvent, "emcorrelationid");
  if (id === undefined) throw new EvmeshError({ kind: "config", message: "the event is not a request (no emcorrelationid)" });
  await client.call(undefined, {
    method: "POST",
    path: "/events/reply",
    body: toJson({ ...replyEvent, emcorrelationid: id }),
    headers: { "content-type": "application/cloudevents+json" },
  });
}

/** {@link Client.serve}. @internal */
export async function serve(client: Conn, consumer: Consumer, handler: Handler): Promise<void> {
  for await (const d of consumer) {
    const isRequest = extension(d.event, "emcorrelationid") !== undefined;
    let answer: CloudEvent | undefined | null;
    try {
      answer = await handler(d.event, d);
    } catch (e) {
      // Requests are never redelivered; an event that is not one comes again.
      d.nack();
      throw e;
    }
    if (answer !== undefined && answer !== null && isRequest) {
      try {
        await reply(client, d.event, answer);
      } catch (e) {
        // A requester that stopped waiting (404) or a broker away for a moment (the requester
        // times out; requests are never redelivered): the responder goes on.
        if (!(e instanceof EvmeshError) || !(e.status === 404 || e.transient)) {
          d.ack();
          throw e;
        }
      }
    }
    d.ack();
  }
}
