/**
 * Server-sent events read from a `fetch` response body (not `EventSource`, which can send
 * neither an `Authorization` header nor a chosen `Last-Event-ID`): an incremental
 * `text/event-stream` parser after the WHATWG HTML rules, for bytes in any chunking.
 * @module
 */

/** One `text/event-stream` event. */
export interface SseEvent {
  /** The `id:` field, if the event had one. */
  id?: string;
  /** The `event:` field, if the event had one. */
  event?: string;
  /** The `data:` lines, joined with `\n`. */
  data: string;
}

/**
 * An incremental `text/event-stream` parser: text in any chunking, complete events out.
 * Comments (`:`) and unknown fields are skipped; a line without a colon is a field with an
 * empty value; an event is dispatched at a blank line once it has a `data` or `event` field.
 */
export class SseParser {
  private line = "";
  private afterCr = false;
  private current: SseEvent = { data: "" };
  private hasData = false;
  private hasEvent = false;
  private readonly decoder = new TextDecoder();

  /** Feeds raw bytes (UTF-8, split anywhere); returns the events they complete. */
  feedBytes(bytes: Uint8Array): SseEvent[] {
    return this.feed(this.decoder.decode(bytes, { stream: true }));
  }

  /** Feeds text; returns the events it completes. */
  feed(text: string): SseEvent[] {
    const out: SseEvent[] = [];
    let start = 0;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (this.afterCr) {
        this.afterCr = false;
        if (c === 10) {
          start = i + 1;
          continue;
        }
      }
      if (c === 10 || c === 13) {
        this.afterCr = c === 13;
        const line = this.line + text.slice(start, i);
        this.line = "";
        start = i + 1;
        this.takeLine(line, out);
      }
    }
    this.line += text.slice(start);
    // A peer that never ends a line cannot grow memory without bound.
    if (this.line.length > 16 * 1024 * 1024) this.line = "";
    return out;
  }

  private takeLine(line: string, out: SseEvent[]): void {
    if (line === "") {
      const ev = this.current;
      const dispatch = this.hasData || this.hasEvent;
      this.current = { data: "" };
      this.hasData = false;
      this.hasEvent = false;
      if (dispatch) out.push(ev);
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        this.current.data = this.hasData ? `${this.current.data}\n${value}` : value;
        this.hasData = true;
        break;
      case "id":
        if (!value.includes("\0")) this.current.id = value;
        break;
      case "event":
        this.current.event = value;
        this.hasEvent = true;
        break;
      default:
        break;
    }
  }
}
