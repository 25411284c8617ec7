// Interop: the A2A 1.0 gateway driven by the official JavaScript A2A SDK (npm `@a2a-js/sdk` 1.x),
// in front of an evmesh agent (Mode 1) that this script runs itself (a `ws` client of
// GET /agent/ws, registered and heart-beating with fetch). Checks, through the SDK's card resolver
// and its JSON-RPC client (the ClientFactory's pick from the card): the card; a blocking
// SendMessage that completes a task whose one artifact holds the agent's chunks; GetTask and
// ListTasks (newest first); a SendStreamingMessage whose first event is the task, then one
// artifact update per chunk, ending at completed; an input-required turn continued by a follow-up
// on the same task; CancelTask of a completed task (TaskNotCancelable) and GetTask of an unknown
// id (TaskNotFound). Then the SDK's HTTP+JSON client: a blocking send, GetTask, TaskNotFound.
// usage: node node_a2a.js TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
const assert = require("node:assert/strict");
const { randomUUID } = require("node:crypto");
const WebSocket = globalThis.WebSocket ?? require("ws"); // Node < 22 has no global WebSocket
const { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver } = require("@a2a-js/sdk/client");
const { SendMessageRequest, GetTaskRequest, CancelTaskRequest, ListTasksRequest, TaskState, Role, taskStateToJSON } =
  require("@a2a-js/sdk");
const { TaskNotFoundError, TaskNotCancelableError } = require("@a2a-js/sdk/errors");

const [traffic] = process.argv.slice(2);
const base = `http://${traffic}`;
const AGENT = "echo-js";
const a2aUrl = `${base}/a2a/${AGENT}`;
const { TASK_STATE_COMPLETED: COMPLETED, TASK_STATE_INPUT_REQUIRED: INPUT_REQUIRED } = TaskState;
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));
const show = (v) => JSON.stringify(v, (k, x) => (k === "state" ? taskStateToJSON(x) : x));

async function post(path, body) {
  const r = await fetch(base + path, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  const text = await r.text();
  assert.ok(r.status === 200 || r.status === 201, `POST ${path}: ${r.status} ${text}`);
  return JSON.parse(text);
}

// The evmesh agent behind the gateway: a prompt with the word "ask" gets one input-required chunk
// "which one?"; any other prompt gets a chunk per word (word + " "), then an empty done.
async function startAgent(agentId) {
  await post("/agent/register", { agentId });
  const beat = async () => assert.equal((await post("/agent/heartbeat", { agentId })).routable, true, "heartbeat");
  await beat();
  const beats = setInterval(() => beat().catch((e) => console.error(`heartbeat failed: ${e}`)), 1000);
  const ws = new WebSocket(`ws://${traffic}/agent/ws?agentId=${agentId}`);
  const prompts = [];
  const send = (chunk) => ws.send(JSON.stringify({ type: "chunk", ...chunk }));
  ws.onmessage = (m) => {
    const event = JSON.parse(typeof m.data === "string" ? m.data : m.data.toString());
    if (event.type !== "evmesh.stream.request") return;
    const [sid, prompt] = [event.emsessionid, event.data];
    prompts.push(prompt);
    const words = prompt.split(/\s+/).filter(Boolean);
    if (words.includes("ask")) {
      send({ sessionId: sid, seq: 0, data: "which one?", done: true, chunkType: "input-required" });
      return;
    }
    words.forEach((word, seq) => send({ sessionId: sid, seq, data: word + " " }));
    send({ sessionId: sid, seq: words.length, data: "", done: true });
  };
  await new Promise((ok, fail) => {
    ws.onopen = ok;
    ws.onerror = (e) => fail(new Error(`agent WebSocket: ${e.message ?? e.error ?? "error"}`));
  });
  for (let i = 0; ; i++) { // until the broker sees the agent attached
    const r = await fetch(`${base}/agent/ws?agentId=${agentId}`);
    await r.text();
    if (r.status === 409) break;
    if (i >= 500) throw new Error(`the agent never attached (GET /agent/ws: ${r.status})`);
    await sleep(20);
  }
  return { prompts, close: () => { clearInterval(beats); ws.close(); } };
}

const texts = (parts) => (parts ?? []).filter((p) => p.content?.$case === "text").map((p) => p.content.value);
const artifactText = (task) => task.artifacts.flatMap((a) => texts(a.parts)).join("");

function userMessage(text, taskId = "", contextId = "") {
  return SendMessageRequest.fromJSON({
    message: { messageId: randomUUID(), role: "ROLE_USER", parts: [{ text }], taskId, contextId },
  });
}

async function sendBlocking(client, request, what) {
  const result = await client.sendMessage(request, { signal: AbortSignal.timeout(20000) });
  assert.ok(result && "status" in result && !("messageId" in result), `${what}: a task expected, got ${show(result)}`);
  return result;
}

async function expectError(call, cls, code, what) {
  let got;
  try {
    got = await call();
  } catch (e) {
    if (!(e instanceof cls)) throw new Error(`${what}: expected ${cls.name} (${code}), got ${e?.stack ?? e}`);
    if (e.transport === "jsonrpc") assert.equal(e.envelopeCode, code, `${what}: JSON-RPC error code`);
    return e;
  }
  throw new Error(`${what}: expected ${cls.name} (${code}), got a result: ${show(got)}`);
}

async function main() {
  const agent = await startAgent(AGENT);

  // a) The card, resolved by the SDK (a base ending in "/": the default path is relative to it).
  const card = await new DefaultAgentCardResolver().resolve(`${a2aUrl}/`);
  assert.equal(card.name, AGENT, "card name");
  const interfaces = (card.supportedInterfaces ?? []).map((i) => [i.url, i.protocolBinding, i.protocolVersion]);
  assert.deepEqual(interfaces, [[a2aUrl, "JSONRPC", "1.0"], [`${a2aUrl}/v1`, "HTTP+JSON", "1.0"]],
    "card supportedInterfaces");
  assert.equal(card.capabilities?.streaming, true, `card capabilities: ${show(card.capabilities)}`);

  // The SDK's default factory picks the card's first interface it knows: JSON-RPC. The client sends
  // A2A-Version: 1.0 on every call (the gateway answers -32009 without it).
  const client = await new ClientFactory().createFromAgentCard(card);
  assert.equal(client.transport.protocolName, "JSONRPC", "the factory's transport");
  assert.equal(client.protocolVersion, "1.0", "the client's A2A-Version");

  // b) A blocking send completes the task; its one artifact holds the chunks, in order.
  const task = await sendBlocking(client, userMessage("hello evmesh world"), "blocking send");
  const tid = task.id;
  assert.ok(tid && task.contextId, `task without id or contextId: ${show(task)}`);
  assert.equal(task.status?.state, COMPLETED, `blocking send: ${show(task)}`);
  assert.equal(task.artifacts.length, 1, `blocking send: one artifact expected: ${show(task)}`);
  assert.equal(artifactText(task), "hello evmesh world ", "blocking send: artifact text");

  // c) GetTask reads the same; ListTasks has it, newest first.
  const got = await client.getTask(GetTaskRequest.fromJSON({ id: tid }));
  assert.ok(got.id === tid && got.status?.state === COMPLETED, `GetTask: ${show(got)}`);
  assert.equal(artifactText(got), "hello evmesh world ", "GetTask: artifact text");
  const ids = (await client.listTasks(ListTasksRequest.fromJSON({}))).tasks.map((t) => t.id);
  assert.equal(ids[0], tid, `ListTasks: the newest task (${tid}) should come first: ${ids}`);

  // d) A streaming send: the task first, then an artifact update per chunk, ending at completed.
  const events = [];
  for await (const e of client.sendMessageStream(userMessage("one two three"), { signal: AbortSignal.timeout(20000) })) {
    events.push(e);
  }
  const kinds = events.map((e) => e.payload?.$case);
  assert.equal(kinds[0], "task", `streaming: the first event should be the task: ${kinds}`);
  const sid = events[0].payload.value.id;
  assert.ok(sid && sid !== tid, `streaming: a new task expected, got ${sid}`);
  const updates = events.filter((e) => e.payload?.$case === "artifactUpdate").map((e) => e.payload.value);
  const chunks = updates.flatMap((u) => texts(u.artifact?.parts)).filter(Boolean);
  assert.deepEqual(chunks, ["one ", "two ", "three "], `streaming: artifact texts (events ${kinds})`);
  assert.equal(new Set(updates.map((u) => u.artifact.artifactId)).size, 1, `streaming: one artifact: ${show(updates)}`);
  assert.ok(updates.slice(1).every((u) => u.append), `streaming: append after the first update: ${show(updates)}`);
  assert.ok(updates.every((u) => u.taskId === sid), `streaming: artifact updates of another task: ${show(updates)}`);
  const statuses = events.filter((e) => e.payload?.$case === "statusUpdate").map((e) => e.payload.value);
  assert.ok(statuses.length && statuses.every((s) => s.taskId === sid), `streaming: status updates ${show(statuses)}`);
  assert.ok(kinds.at(-1) === "statusUpdate" && statuses.at(-1).status?.state === COMPLETED,
    `streaming: should end at TASK_STATE_COMPLETED: ${kinds}, last ${show(events.at(-1))}`);
  const streamed = await client.getTask(GetTaskRequest.fromJSON({ id: sid }));
  assert.ok(streamed.status?.state === COMPLETED && artifactText(streamed) === "one two three ",
    `GetTask after streaming: ${show(streamed)}`);

  // e) An input-required turn, then a follow-up on the same task that completes it.
  const asked = await sendBlocking(client, userMessage("ask me"), "ask");
  assert.equal(asked.status?.state, INPUT_REQUIRED, `ask: ${show(asked)}`);
  const msg = asked.status.message;
  assert.ok(msg?.role === Role.ROLE_AGENT, `ask: status message role: ${show(msg)}`);
  assert.deepEqual(texts(msg.parts), ["which one?"], "ask: status message text");
  const answered = await sendBlocking(client, userMessage("the red one", asked.id, asked.contextId), "follow-up");
  assert.equal(answered.id, asked.id, "follow-up: the same task");
  assert.equal(answered.contextId, asked.contextId, "follow-up: the same contextId");
  assert.equal(answered.status?.state, COMPLETED, `follow-up: ${show(answered)}`);
  assert.ok(artifactText(answered).includes("the red one "), `follow-up: artifact text ${artifactText(answered)}`);

  // f) CancelTask of a completed task: TaskNotCancelable (-32002).
  await expectError(() => client.cancelTask(CancelTaskRequest.fromJSON({ id: tid })), TaskNotCancelableError, -32002,
    "CancelTask of a completed task");
  // g) GetTask of an unknown id: TaskNotFound (-32001).
  await expectError(() => client.getTask(GetTaskRequest.fromJSON({ id: "no-such-task" })), TaskNotFoundError, -32001,
    "GetTask of no-such-task");

  // h) The SDK's HTTP+JSON transport, preferred over the card's order: POST .../v1/message:send,
  // GET .../v1/tasks/{id}, and a 404 whose google.rpc ErrorInfo the SDK maps to TaskNotFound.
  const restFactory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, { preferredTransports: ["HTTP+JSON"] }));
  const rest = await restFactory.createFromAgentCard(card);
  assert.equal(rest.transport.protocolName, "HTTP+JSON", "the REST client's transport");
  const rtask = await sendBlocking(rest, userMessage("rest call"), "REST send");
  assert.equal(rtask.status?.state, COMPLETED, `REST send: ${show(rtask)}`);
  assert.equal(artifactText(rtask), "rest call ", "REST send: artifact text");
  const rgot = await rest.getTask(GetTaskRequest.fromJSON({ id: rtask.id }));
  assert.ok(rgot.id === rtask.id && rgot.status?.state === COMPLETED, `REST GetTask: ${show(rgot)}`);
  const notFound = await expectError(() => rest.getTask(GetTaskRequest.fromJSON({ id: "no-such-task" })),
    TaskNotFoundError, 404, "REST GetTask of no-such-task");
  assert.equal(notFound.statusCode, 404, "REST GetTask of no-such-task: HTTP status");

  agent.close();
  assert.deepEqual(agent.prompts, ["hello evmesh world", "one two three", "ask me", "the red one", "rest call"],
    "the agent's prompts");
}

const deadline = setTimeout(() => { console.error("FAILED: timed out after 90 s"); process.exit(1); }, 90000);
main().then(
  () => { clearTimeout(deadline); console.log("all checks passed"); process.exit(0); },
  (e) => {
    const cause = e?.cause ? ` (cause: ${e.cause.message ?? e.cause})` : "";
    console.error(`FAILED: ${e?.stack ?? e}${cause}`);
    process.exit(1);
  },
);
