// The client's types against the OpenAPI document (openapi/evmesh.yaml), at compile time:
// `npm run typecheck` generates openapi.d.ts from the document with openapi-typescript and
// compiles this file. Each line fails to compile when the client's type and the document's
// schema stop fitting: what the client sends must be what the document accepts, and what the
// document says the broker answers must be what the client reads.
import type { components } from "./openapi.js";
import type { CloudEvent, Filter, Mode, Published, Start, Subscription } from "../src/index.js";

type Schema = components["schemas"];

/** `A` is assignable to `B` (or this is `never`, and the assignment below fails). */
type Fits<A, B> = [A] extends [B] ? true : never;

// What the client sends.
export const subscription: Fits<Subscription, Schema["SubscriptionRequest"]> = true;
export const filter: Fits<Filter, Schema["Filter"]> = true;
export const start: Fits<Start, Schema["Start"]> = true;
export const mode: Fits<Mode, NonNullable<Schema["SubscriptionRequest"]["mode"]>> = true;
// The named attributes. (Extensions: the client's type takes any value where the document
// says string, number, boolean or null, because one TypeScript interface cannot give `data`
// `unknown` and every other key a narrower type; the client refuses an object attribute at
// run time, as the broker does with a 400.)
type Named = "specversion" | "id" | "source" | "type" | "datacontenttype" | "dataschema" | "subject" | "time" | "data" | "data_base64";
export const event: Fits<Pick<CloudEvent, Named>, Pick<Schema["CloudEvent"], Named>> = true;

// What the broker answers, as the client reads it.
export const published: Fits<Omit<Schema["Published"], "offset">, Omit<Published, "offset">> = true;
export const answeredEvent: Fits<Schema["CloudEvent"], CloudEvent> = true;
export const answeredFilter: Fits<Schema["Filter"], Filter> = true;
export const answeredStart: Fits<Schema["Start"], Start> = true;
