// Interop: an agent streaming call's turn read by a WHATWG EventSource (npm `eventsource`, the
// browser API for Node): named events (`chunk`, `done`, `error`), `id:` as lastEventId, and the
// reconnect when a stream ends (with `Last-Event-ID`), which the broker's 204 stops. The agent is
// `evmesh agent --agent-id js-echo` (started by the test), echoing the prompt a word per chunk.
// usage: node node_eventsource.js TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
const { EventSource } = require("eventsource");
const assert = require("node:assert/strict");

const [traffic] = process.argv.slice(2);
const base = `http://${traffic}`;

async function openSession() {
  // Until the agent has registered and attached.
  for (let i = 0; i < 200; i++) {
    const r = await fetch(`${base}/session/open`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ clientId: "js", agentId: "js-echo" }),
    });
    if (r.status === 201) return (await r.json()).sessionId;
    await new Promise((ok) => setTimeout(ok, 50));
  }
  throw new Error("the agent never became routable");
}

// Starts a turn and reads its stream until the first event, then drops the connection: the
// turn goes on at the agent, for the EventSource to read.
async function startTurn(sid, prompt) {
  for (let i = 0; i < 200; i++) {
    const ctl = new AbortController();
    const r = await fetch(`${base}/session/stream/${sid}`, {
      method: "POST", headers: { "content-type": "text/plain" }, body: prompt, signal: ctl.signal,
    });
    if (r.status === 503) { // the agent's WebSocket is not attached yet
      await r.text();
      await new Promise((ok) => setTimeout(ok, 50));
      continue;
    }
    assert.equal(r.status, 200);
    const reader = r.body.getReader();
    const { value } = await reader.read();
    assert.match(Buffer.from(value).toString(), /id: 0\nevent: chunk\n/);
    ctl.abort();
    return;
  }
  throw new Error("the agent never attached");
}

// Reads the session's current turn with an EventSource until it stops reconnecting.
function read(sid, onChunk) {
  return new Promise((resolve, reject) => {
    const got = [];
    let opens = 0;
    const es = new EventSource(`${base}/session/stream/${sid}`);
    const timer = setTimeout(() => { es.close(); reject(new Error(`stuck after ${JSON.stringify(got)}`)); }, 20000);
    es.onopen = () => { opens += 1; };
    es.addEventListener("chunk", (e) => { got.push(["chunk", e.lastEventId, e.data]); onChunk?.(got.length); });
    es.addEventListener("done", (e) => got.push(["done", e.lastEventId, e.data]));
    es.addEventListener("error", (e) => {
      if (e.data !== undefined) {
        got.push(["error", e.lastEventId, e.data]); // the broker's `event: error`
      } else if (es.readyState === EventSource.CLOSED) {
        // The reconnect after the stream ended got 204: no more reconnects.
        clearTimeout(timer);
        resolve({ got, opens, lastEventId: got.at(-1)?.[1] });
      }
    });
  });
}

(async () => {
  const sid = await openSession();
  assert.match(sid, /^js-echo:[0-9a-f-]{36}$/);

  // A whole turn: chunks with their seq as id, then done; the reconnect after the end is the 204.
  const words = ["alpha", " beta", " gamma", " delta"];
  await startTurn(sid, "alpha beta gamma delta");
  const turn = await read(sid);
  assert.deepEqual(turn.got, [
    ...words.map((w, i) => ["chunk", String(i), w]),
    ["done", "4", ""],
  ]);
  assert.equal(turn.opens, 1, "one stream; the reconnect was answered 204");
  console.log("ok turn", JSON.stringify(turn.got));

  // Cancel while the EventSource reads: the broker's error event, then the end.
  await startTurn(sid, Array.from({ length: 200 }, (_, i) => `w${i}`).join(" "));
  const cancelled = await read(sid, (n) => {
    if (n === 2) fetch(`${base}/session/cancel/${sid}`, { method: "POST" });
  });
  const last = cancelled.got.at(-1);
  assert.equal(last[0], "error");
  assert.equal(last[2], "cancelled");
  assert.ok(cancelled.got.slice(0, -1).every(([kind]) => kind === "chunk"), JSON.stringify(cancelled.got));
  assert.ok(cancelled.got.length < 200, "cancelled before the agent was done");
  console.log("ok cancel after", cancelled.got.length - 1, "chunks");
  console.log("all checks passed");
})().catch((e) => { console.error(e); process.exit(1); });
