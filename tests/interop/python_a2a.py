"""Interop: the A2A 1.0 gateway driven by the official Python A2A SDK (`a2a-sdk` 1.x), in front of
an evmesh agent (Mode 1) that this script runs itself (a `websockets` client of GET /agent/ws,
registered and heart-beating with `httpx`). Checks, through the SDK's JSON-RPC client: the agent
card (name, the JSONRPC and HTTP+JSON interfaces, streaming); a blocking SendMessage that completes
a task whose one artifact holds the agent's chunks; GetTask and ListTasks (newest first); a
SendStreamingMessage whose first event is the task, then one artifact update per chunk, ending at
completed; an input-required turn continued by a follow-up message on the same task; CancelTask of
a completed task (TaskNotCancelable) and GetTask of an unknown id (TaskNotFound). With raw `httpx`:
a JSON-RPC call without A2A-Version (-32009 VERSION_NOT_SUPPORTED) and the REST binding
(message:send, tasks/{id}, a 404 with a google.rpc ErrorInfo).

usage: python_a2a.py TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
"""
import asyncio
import json
import sys
import threading
import time

import httpx
from websockets.sync.client import connect

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import get_text_parts, new_text_message
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Role,
    SendMessageRequest,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskState,
)

traffic = sys.argv[1]
base = f"http://{traffic}"
a2a_url = f"{base}/a2a/echo"
http = httpx.Client(base_url=base, timeout=20)
COMPLETED, INPUT_REQUIRED = TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_INPUT_REQUIRED


def wait(cond, what):
    for _ in range(500):
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"never: {what}")


class Agent(threading.Thread):
    """The evmesh agent behind the gateway: a prompt with the word "ask" gets one input-required
    chunk "which one?"; any other prompt gets a chunk per word (word + " "), then an empty done."""

    def __init__(self, agent_id):
        super().__init__(daemon=True)
        r = http.post("/agent/register", json={"agentId": agent_id})
        assert r.status_code in (200, 201), f"register: {r.status_code} {r.text}"
        self.beats = httpx.Client(base_url=base, timeout=20)  # its own client: used from a thread
        self.agent_id = agent_id
        self.beat()
        threading.Thread(target=self.keep_beating, daemon=True).start()
        self.ws = connect(f"ws://{traffic}/agent/ws?agentId={agent_id}")
        wait(lambda: http.get(f"/agent/ws?agentId={agent_id}").status_code == 409, "the agent attached")
        self.prompts, self.notices = [], []
        self.start()

    def beat(self):
        r = self.beats.post("/agent/heartbeat", json={"agentId": self.agent_id})
        assert r.json()["routable"] is True, f"heartbeat: {r.status_code} {r.text}"

    def keep_beating(self):
        while True:
            time.sleep(1)
            try:
                self.beat()
            except Exception as e:  # noqa: BLE001 (a failed beat shows up as an unroutable agent)
                print(f"heartbeat failed: {e!r}", file=sys.stderr)

    def run(self):
        try:
            while True:
                event = json.loads(self.ws.recv())
                if event["type"] != "evmesh.stream.request":
                    self.notices.append(event["type"])
                    continue
                self.prompts.append(event["data"])
                self.answer(event["emsessionid"], event["data"])
        except Exception:
            return  # the socket closed

    def send(self, **chunk):
        self.ws.send(json.dumps({"type": "chunk", **chunk}))

    def answer(self, sid, prompt):
        words = prompt.split()
        if "ask" in words:
            self.send(sessionId=sid, seq=0, data="which one?", done=True, chunkType="input-required")
            return
        for seq, word in enumerate(words):
            self.send(sessionId=sid, seq=seq, data=word + " ")
        self.send(sessionId=sid, seq=len(words), data="", done=True)


def state(task):
    return TaskState.Name(task.status.state)


def artifact_text(task):
    """Every artifact's text parts, concatenated (the gateway keeps one artifact per task)."""
    return "".join(t for a in task.artifacts for t in get_text_parts(a.parts))


def user_message(text, task_id=None, context_id=None):
    return SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER, task_id=task_id,
                                                       context_id=context_id))


async def send_blocking(client, request):
    events = [e async for e in client.send_message(request)]
    assert len(events) == 1 and events[0].HasField("task"), f"blocking send: one task expected, got {events}"
    return events[0].task


async def expect_error(call, error_cls, code, what):
    try:
        got = await call
    except error_cls:
        return
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{what}: expected {error_cls.__name__} ({code}), got {e!r}") from e
    raise AssertionError(f"{what}: expected {error_cls.__name__} ({code}), got a result: {got}")


async def main():
    agent = Agent("echo")

    # a) The card, resolved by the SDK (a plain httpx client: no A2A-Version header on this GET).
    async with httpx.AsyncClient(timeout=20) as plain:
        card = await A2ACardResolver(plain, a2a_url).get_agent_card()
    assert card.name == "echo", f"card name: {card.name!r}"
    interfaces = [(i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces]
    assert interfaces == [(a2a_url, "JSONRPC", "1.0"), (f"{a2a_url}/v1", "HTTP+JSON", "1.0")], \
        f"card supportedInterfaces: {interfaces}"
    assert card.capabilities.streaming is True, f"card capabilities: {card.capabilities}"

    # The SDK clients: JSON-RPC (the factory's default binding, picked from the card), sharing one
    # httpx client on which the factory sets A2A-Version: 1.0.
    hc = httpx.AsyncClient(timeout=20)
    blocking = ClientFactory(ClientConfig(streaming=False, httpx_client=hc)).create(card)
    streaming = ClientFactory(ClientConfig(streaming=True, httpx_client=hc)).create(card)
    assert hc.headers.get("A2A-Version") == "1.0", f"the SDK's headers: {hc.headers}"

    # b) A blocking send completes the task; its one artifact holds the chunks, in order.
    task = await send_blocking(blocking, user_message("hello evmesh world"))
    tid = task.id
    assert tid and task.context_id, f"task without id or contextId: {task}"
    assert state(task) == "TASK_STATE_COMPLETED", f"blocking send: state {state(task)}: {task}"
    assert len(task.artifacts) == 1, f"blocking send: one artifact expected: {task}"
    assert artifact_text(task) == "hello evmesh world ", f"blocking send: artifact text {artifact_text(task)!r}"

    # c) GetTask reads the same; ListTasks has it, newest first.
    got = await blocking.get_task(GetTaskRequest(id=tid))
    assert got.id == tid and state(got) == "TASK_STATE_COMPLETED", f"GetTask: {got}"
    assert artifact_text(got) == "hello evmesh world ", f"GetTask: artifact text {artifact_text(got)!r}"
    listed = await blocking.list_tasks(ListTasksRequest())
    ids = [t.id for t in listed.tasks]
    assert tid in ids, f"ListTasks: {tid} not in {ids}"
    assert ids[0] == tid, f"ListTasks: the newest task ({tid}) should come first: {ids}"

    # d) A streaming send: the task first, then an artifact update per chunk, ending at completed.
    async def collect():
        return [e async for e in streaming.send_message(user_message("one two three"))]
    events = await asyncio.wait_for(collect(), 20)
    kinds = [e.WhichOneof("payload") for e in events]
    assert events and kinds[0] == "task", f"streaming: the first event should be the task: {kinds}"
    sid = events[0].task.id
    assert sid and sid != tid, f"streaming: a new task expected, got {sid!r}"
    updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
    # The task comes as it is when the stream starts: chunks the agent sent before are in it.
    first = [t for a in events[0].task.artifacts for t in get_text_parts(a.parts) if t]
    texts = first + [t for u in updates for t in get_text_parts(u.artifact.parts) if t]
    assert "".join(texts) == "one two three ", f"streaming: artifact texts {texts} (events {kinds})"
    ids = {u.artifact.artifact_id for u in updates} | {a.artifact_id for a in events[0].task.artifacts}
    assert len(ids) == 1, f"streaming: one artifact expected: {events}"
    assert all(u.append for u in updates[1:]), f"streaming: append after the first update: {updates}"
    assert all(u.task_id == sid for u in updates), f"streaming: artifact updates of another task: {updates}"
    statuses = [e.status_update for e in events if e.HasField("status_update")]
    assert statuses and all(s.task_id == sid for s in statuses), f"streaming: status updates {statuses}"
    assert kinds[-1] == "status_update" and statuses[-1].status.state == COMPLETED, \
        f"streaming: should end at TASK_STATE_COMPLETED: {kinds}, last {events[-1]}"
    got = await blocking.get_task(GetTaskRequest(id=sid))
    assert state(got) == "TASK_STATE_COMPLETED" and artifact_text(got) == "one two three ", \
        f"GetTask after streaming: {state(got)} {artifact_text(got)!r}"

    # e) An input-required turn, then a follow-up on the same task that completes it.
    asked = await send_blocking(blocking, user_message("ask me"))
    assert asked.status.state == INPUT_REQUIRED, f"ask: state {state(asked)}: {asked}"
    msg = asked.status.message
    assert msg.role == Role.ROLE_AGENT and get_text_parts(msg.parts) == ["which one?"], \
        f"ask: status message {msg}"
    answered = await send_blocking(blocking, user_message("the red one", asked.id, asked.context_id))
    assert answered.id == asked.id, f"follow-up: same task expected, {asked.id} != {answered.id}"
    assert answered.context_id == asked.context_id, f"follow-up: contextId {answered.context_id}"
    assert state(answered) == "TASK_STATE_COMPLETED", f"follow-up: state {state(answered)}: {answered}"
    assert "the red one " in artifact_text(answered), f"follow-up: artifact text {artifact_text(answered)!r}"

    # f) CancelTask of a completed task: TaskNotCancelable (-32002).
    await expect_error(blocking.cancel_task(CancelTaskRequest(id=tid)), TaskNotCancelableError, -32002,
                       "CancelTask of a completed task")
    # g) GetTask of an unknown id: TaskNotFound (-32001).
    await expect_error(blocking.get_task(GetTaskRequest(id="no-such-task")), TaskNotFoundError, -32001,
                       "GetTask of no-such-task")

    await blocking.close()
    await streaming.close()
    await hc.aclose()
    assert agent.prompts == ["hello evmesh world", "one two three", "ask me", "the red one"], \
        f"the agent's prompts: {agent.prompts}"


asyncio.run(main())

# h) JSON-RPC without the A2A-Version header: VersionNotSupported, in a 200.
r = http.post("/a2a/echo", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}})
assert r.status_code == 200, f"no A2A-Version: HTTP {r.status_code} {r.text}"
error = r.json().get("error") or {}
assert error.get("code") == -32009, f"no A2A-Version: error {r.text}"
assert (error.get("data") or [{}])[0].get("reason") == "VERSION_NOT_SUPPORTED", f"no A2A-Version: {r.text}"

# i) The REST binding.
rest = {"A2A-Version": "1.0"}
r = http.post("/a2a/echo/v1/message:send", headers=rest,
              json={"message": {"messageId": "r1", "role": "ROLE_USER", "parts": [{"text": "rest call"}]}})
assert r.status_code == 200, f"REST message:send: HTTP {r.status_code} {r.text}"
task = r.json().get("task") or {}
assert task.get("id") and task.get("status", {}).get("state") == "TASK_STATE_COMPLETED", f"REST message:send: {r.text}"
r = http.get(f"/a2a/echo/v1/tasks/{task['id']}", headers=rest)
assert r.status_code == 200 and r.json().get("id") == task["id"], f"REST GET tasks/{task['id']}: {r.status_code} {r.text}"
r = http.get("/a2a/echo/v1/tasks/nope", headers=rest)
assert r.status_code == 404, f"REST GET tasks/nope: HTTP {r.status_code} {r.text}"
details = r.json().get("error", {}).get("details") or [{}]
assert details[0].get("reason") == "TASK_NOT_FOUND", f"REST GET tasks/nope: {r.text}"

print("all checks passed")
