"""Interop: the A2A 1.0 gateway fronting a *remote* A2A server (Mode 2), both ends being the
official Python A2A SDK (`a2a-sdk` 1.x). This script starts, in a thread of its own process, a real
SDK server "remote-echo" (an AgentExecutor behind DefaultRequestHandler + InMemoryTaskStore, served
by the SDK's Starlette routes under uvicorn on 127.0.0.1): it answers a message T with a task whose
artifact, sent in two chunks, reads "echo: " + T; a message with "slow" in it stays working ~5 s
and honours CancelTask. The script registers it with evmesh (POST /agent/register with a2aUrl),
then, through the SDK's JSON-RPC client against http://TRAFFIC/a2a/remote-echo, checks: the card
evmesh re-serves (the remote's name/skills, evmesh's own URLs); a blocking SendMessage that
completes with "echo: hi"; GetTask of it; a SendStreamingMessage whose artifact updates add up to
"echo: stream me" and end at completed; a return-immediately send of "slow" then CancelTask
(canceled, also on GetTask); GetTask of an unknown id (TaskNotFound, -32001).

usage: python_a2a_remote.py TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
"""
import asyncio
import socket
import sys
import threading
import time

import httpx
import uvicorn
from starlette.applications import Starlette

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import get_text_parts, new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskNotFoundError,
    TaskState,
)

AGENT_ID = "remote-echo"
SLOW_SECONDS = 5


class EchoExecutor(AgentExecutor):
    """The remote agent: a task, working, the artifact "echo: " + T in two chunks, completed."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        text = context.get_user_input()
        await updater.start_work()
        if "slow" in text:
            await asyncio.sleep(SLOW_SECONDS)  # a CancelTask meanwhile cancels this coroutine
        await updater.add_artifact([new_text_part("echo: ")], artifact_id="echo", name="echo")
        await asyncio.sleep(0.05)  # two chunks, apart in time
        await updater.add_artifact([new_text_part(text)], artifact_id="echo", append=True, last_chunk=True)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def remote_card(url):
    return AgentCard(
        name=AGENT_ID,
        description="Echoes each message back as an artifact, in two chunks.",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="Echoes the message text.",
                           tags=["echo"], examples=["hi"])],
    )


def start_remote():
    """Serves remote-echo on a free port of 127.0.0.1 from a daemon thread; returns its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    card = remote_card(url)
    handler = DefaultRequestHandler(agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(),
                                    agent_card=card)
    app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    for _ in range(500):
        try:
            if httpx.get(f"{url}/.well-known/agent-card.json", timeout=2).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"the remote A2A server at {url} never answered its card")


def state(task):
    return TaskState.Name(task.status.state)


def artifact_text(task):
    return "".join(t for a in task.artifacts for t in get_text_parts(a.parts))


def user_message(text, **config):
    return SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER),
                              configuration=SendMessageConfiguration(**config))


async def send_blocking(client, request):
    events = [e async for e in client.send_message(request)]
    assert len(events) == 1 and events[0].HasField("task"), f"send: one task expected, got {events}"
    return events[0].task


async def check(a2a_url):
    """Every client check, against the A2A server at a2a_url (evmesh's, or the remote's itself)."""
    # a) The card: the remote's name, skills and capabilities; a2a_url's own interface first.
    async with httpx.AsyncClient(timeout=20) as plain:
        card = await A2ACardResolver(plain, a2a_url).get_agent_card()
    assert card.name == AGENT_ID, f"card name: {card.name!r}"
    first = card.supported_interfaces[0] if card.supported_interfaces else None
    assert first and (first.url, first.protocol_binding, first.protocol_version) == (a2a_url, "JSONRPC", "1.0"), \
        f"card supportedInterfaces: {card.supported_interfaces}"
    assert card.capabilities.streaming is True, f"card capabilities: {card.capabilities}"
    assert [s.id for s in card.skills] == ["echo"], f"card skills: {card.skills}"

    hc = httpx.AsyncClient(timeout=30)
    blocking = ClientFactory(ClientConfig(streaming=False, httpx_client=hc)).create(card)
    streaming = ClientFactory(ClientConfig(streaming=True, httpx_client=hc)).create(card)

    # b) A blocking send completes a task: "echo: hi". GetTask reads the same.
    task = await send_blocking(blocking, user_message("hi"))
    assert task.id and state(task) == "TASK_STATE_COMPLETED", f"send hi: state {state(task)}: {task}"
    assert artifact_text(task) == "echo: hi", f"send hi: artifact text {artifact_text(task)!r}"
    got = await blocking.get_task(GetTaskRequest(id=task.id))
    assert got.id == task.id and state(got) == "TASK_STATE_COMPLETED", f"GetTask: {got}"
    assert artifact_text(got) == "echo: hi", f"GetTask: artifact text {artifact_text(got)!r}"

    # c) A streaming send: artifact updates add up to "echo: stream me"; the last event: completed.
    async def collect():
        return [e async for e in streaming.send_message(user_message("stream me"))]
    events = await asyncio.wait_for(collect(), 20)
    kinds = [e.WhichOneof("payload") for e in events]
    updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
    texts = [t for u in updates for t in get_text_parts(u.artifact.parts)]
    assert "".join(texts) == "echo: stream me", f"streaming: artifact texts {texts} (events {kinds})"
    last = events[-1] if events else None
    assert last is not None and last.HasField("status_update") and \
        last.status_update.status.state == TaskState.TASK_STATE_COMPLETED, \
        f"streaming: should end at TASK_STATE_COMPLETED: {kinds}, last {last}"
    sid = last.status_update.task_id
    assert sid and sid != task.id and all(u.task_id == sid for u in updates), f"streaming: task ids {events}"

    # d) "slow", returned at once (still running), then CancelTask: canceled, and GetTask agrees.
    slow = await send_blocking(blocking, user_message("slow", return_immediately=True))
    assert state(slow) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"), f"slow: state {state(slow)}: {slow}"
    started = time.monotonic()
    canceled = await blocking.cancel_task(CancelTaskRequest(id=slow.id))
    assert canceled.id == slow.id and state(canceled) == "TASK_STATE_CANCELED", f"CancelTask: {canceled}"
    assert time.monotonic() - started < SLOW_SECONDS, "CancelTask waited for the slow task to finish"
    got = await blocking.get_task(GetTaskRequest(id=slow.id))
    assert state(got) == "TASK_STATE_CANCELED", f"GetTask after CancelTask: {state(got)}: {got}"

    # e) GetTask of an unknown id: TaskNotFound (-32001).
    try:
        got = await blocking.get_task(GetTaskRequest(id="no-such-task"))
    except TaskNotFoundError:
        pass
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"GetTask of no-such-task: expected TaskNotFoundError (-32001), got {e!r}") from e
    else:
        raise AssertionError(f"GetTask of no-such-task: expected TaskNotFoundError (-32001), got {got}")

    await blocking.close()
    await streaming.close()
    await hc.aclose()


def main():
    traffic = sys.argv[1]  # argv[2], the admin address, is not needed here
    base = f"http://{traffic}"
    remote = start_remote()
    r = httpx.post(f"{base}/agent/register", json={"agentId": AGENT_ID, "a2aUrl": remote}, timeout=20)
    assert r.status_code in (200, 201), f"register {remote}: {r.status_code} {r.text}"
    asyncio.run(check(f"{base}/a2a/{AGENT_ID}"))
    print("all checks passed")


if __name__ == "__main__":
    main()
