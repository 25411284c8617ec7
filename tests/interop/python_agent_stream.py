"""Interop: agent streaming calls (Mode 1) with independent Python clients. Agents are
`websockets` clients of GET /agent/ws (registered and heart-beating with `httpx`); clients open
sessions with `httpx` and read turns with `httpx-sse` (EventSource semantics: `id:`, `event:`,
a reconnect with `Last-Event-ID`). Checks: streamed turns, several per session on the same agent,
cancel, resume after a dropped connection, an agent that disconnects mid-turn, idle expiry.

usage: python_agent_stream.py TRAFFIC_HOST:PORT ADMIN_HOST:PORT   (exit 0 = every check passed)
The broker runs with session_ttl_ms = 1500.
"""
import json
import sys
import threading
import time

import httpx
from httpx_sse import connect_sse
from websockets.sync.client import connect

traffic = sys.argv[1]
base = f"http://{traffic}"
http = httpx.Client(base_url=base, timeout=20)


class Agent(threading.Thread):
    """An agent answering each turn a word per chunk, `pause` seconds apart, until cancelled.
    With `leave_after`, it closes its WebSocket after that many chunks of its first turn."""

    def __init__(self, agent_id, pause=0.0, leave_after=None):
        super().__init__(daemon=True)
        r = http.post("/agent/register", json={"agentId": agent_id})
        assert r.status_code in (200, 201), r.text
        assert http.post("/agent/heartbeat", json={"agentId": agent_id}).json()["routable"] is True
        self.ws = connect(f"ws://{traffic}/agent/ws?agentId={agent_id}")
        # Attached once its session claimed the agent (the 101 comes first): 409 for another.
        wait(lambda: http.get(f"/agent/ws?agentId={agent_id}").status_code == 409, "attached")
        self.pause, self.leave_after = pause, leave_after
        self.turns, self.notices = [], []
        self.start()

    def run(self):
        try:
            while True:
                event = json.loads(self.ws.recv())
                if event["type"] != "evmesh.stream.request":
                    self.notices.append(event["type"])
                    continue
                self.turns.append(event)
                self.answer(event["emsessionid"], event["data"].split())
        except Exception:
            return  # the socket closed

    def answer(self, sid, words):
        for seq, word in enumerate(words):
            if self.leave_after is not None and seq == self.leave_after:
                self.ws.close()
                return
            self.ws.send(json.dumps({"type": "chunk", "sessionId": sid, "seq": seq, "data": word}))
            try:
                event = json.loads(self.ws.recv(timeout=self.pause))
            except TimeoutError:
                continue
            self.notices.append(event["type"])
            if event["type"] == "evmesh.stream.cancel":
                return
        self.ws.send(json.dumps({"type": "chunk", "sessionId": sid, "seq": len(words), "done": True}))


def open_session(agent_id):
    r = http.post("/session/open", json={"clientId": "py-client", "agentId": agent_id})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["agentId"] == agent_id and body["sessionId"].startswith(agent_id + ":"), body
    assert body["instanceUrl"] == base, body
    return body["sessionId"]


def wait(cond, what):
    for _ in range(200):
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"never: {what}")


# Streamed turns: every chunk with its seq as id, the last one `done`; three turns of one session
# all reach the same agent.
echo = Agent("py-echo")
sid = open_session("py-echo")
for turn in range(3):
    prompt = f"the quick brown fox {turn}"
    with connect_sse(http, "POST", f"/session/stream/{sid}", content=prompt,
                     headers={"content-type": "text/plain"}) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        got = [(e.id, e.event, e.data) for e in source.iter_sse()]
    words = prompt.split()
    assert got == [(str(i), "chunk", w) for i, w in enumerate(words)] + [(str(len(words)), "done", "")], got
assert [t["data"] for t in echo.turns] == [f"the quick brown fox {t}" for t in range(3)]
assert all(t["emsessionid"] == sid for t in echo.turns)
r = http.post(f"/session/stream/{sid}", content="x")  # (no turn is in progress: this one streams)
assert r.status_code == 200 and "event: done" in r.text, r.text

# Cancel mid-turn: the stream ends with an error event; the agent is told.
slow = Agent("py-slow", pause=0.1)
sid = open_session("py-slow")
with connect_sse(http, "POST", f"/session/stream/{sid}", content=" ".join(["w"] * 100)) as source:
    events = source.iter_sse()
    assert next(events).event == "chunk"
    r = http.post(f"/session/cancel/{sid}")
    assert r.json() == {"sessionId": sid, "turn": "cancelled"}, r.text
    rest = list(events)
    assert rest[-1].event == "error" and rest[-1].data == "cancelled", rest
    assert all(e.event == "chunk" for e in rest[:-1]), rest
wait(lambda: "evmesh.stream.cancel" in slow.notices, "the agent hears of the cancel")

# Resume: a client whose connection dropped reconnects with Last-Event-ID and gets the rest.
with connect_sse(http, "POST", f"/session/stream/{sid}", content="one two three four five") as source:
    first = next(source.iter_sse())
    assert (first.id, first.data) == ("0", "one")
with connect_sse(http, "GET", f"/session/stream/{sid}", headers={"last-event-id": first.id}) as source:
    rest = [(e.id, e.event, e.data) for e in source.iter_sse()]
assert rest == [("1", "chunk", "two"), ("2", "chunk", "three"), ("3", "chunk", "four"), ("4", "chunk", "five"),
                ("5", "done", "")], rest
r = http.get(f"/session/stream/{sid}", headers={"last-event-id": "5"})
assert r.status_code == 204, r.status_code  # nothing more: an EventSource stops reconnecting

# An agent that disconnects mid-turn: the turn ends with an error event, not a hang.
flaky = Agent("py-flaky", leave_after=2)
sid = open_session("py-flaky")
with connect_sse(http, "POST", f"/session/stream/{sid}", content="a b c d") as source:
    got = [(e.event, e.data) for e in source.iter_sse()]
assert got == [("chunk", "a"), ("chunk", "b"), ("error", "the agent disconnected")], got
r = http.post(f"/session/stream/{sid}", content="again")
assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json", r.text

# An idle session expires (session_ttl_ms): its turn in progress ends with an error event, and the
# session is gone.
mute = Agent("py-mute", pause=30)
sid = open_session("py-mute")
mute.answer = lambda sid, words: None  # takes the turn, says nothing
with connect_sse(http, "POST", f"/session/stream/{sid}", content="hello?") as source:
    got = [(e.event, e.data) for e in source.iter_sse()]
assert got == [("error", "the session expired")], got
assert http.post(f"/session/stream/{sid}", content="x").status_code == 404

print("all checks passed")
