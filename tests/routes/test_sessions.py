"""Which conversation a request belongs to, seen from the client, over real sockets.

Ids clients send come first; a body's `user` (an end user) never merges conversations; and two
independent conversations that share the key, the system prompt and the first user message (the
same agent started twice on one task) share no loop, budget or circuit state once they diverge.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from tests.conftest import ProxyFactory, base_url, sim_config

KEY = "sk-team-0001"
KEYS = f"""
keys:
  api_keys:
    - {{name: team, key: {KEY}}}
    - {{name: other, key: sk-other-0002}}
"""
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
TASK = {"role": "user", "content": "Fix the failing test in tests/test_parser.py."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


async def start(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer, policies: str = ""
) -> TestServer:
    path = tmp_path / "sessions.yaml"
    extra = f"store: {{path: {tmp_path / 'state'}}}\n{textwrap.dedent(KEYS)}\n"
    path.write_text(sim_config(str(upstream.make_url("")).rstrip("/"), extra + policies))
    return await start_proxy(path)


async def send(
    proxy: TestServer,
    messages: list[dict[str, Any]],
    headers: dict[str, str] | None = None,
    key: str = KEY,
    **body: Any,
) -> Any:
    async with openai.AsyncOpenAI(base_url=base_url(proxy), api_key=key, max_retries=0) as sdk:
        return await sdk.chat.completions.with_raw_response.create(
            model="sim",
            messages=messages,  # type: ignore[arg-type]
            extra_headers=headers or {},
            **body,
        )


def answered(raw: Any) -> dict[str, Any]:
    message: dict[str, Any] = raw.parse().choices[0].message.model_dump(exclude_none=True)
    return message


def session_of(raw: Any) -> str:
    name: str = raw.headers["x-agentproxy-session"]
    return name


# --- identity -------------------------------------------------------------------------------


async def test_the_user_field_does_not_merge_conversations(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    one = await send(proxy, [SYSTEM, TASK], user="end-user-7")
    other_task = {"role": "user", "content": "Other task."}
    other = await send(proxy, [SYSTEM, other_task], user="end-user-7")
    assert session_of(one) != session_of(other)
    assert "end-user-7" not in (session_of(one), session_of(other))
    # And the same conversation opened for two end users is two conversations.
    third = await send(proxy, [SYSTEM, TASK], user="end-user-8")
    assert session_of(third) != session_of(one)


@pytest.mark.parametrize(
    "headers, body, expected",
    [
        ({"x-agentproxy-session": "mine", "x-claude-code-session-id": "cc"}, {}, "mine"),
        ({"X-Claude-Code-Session-Id": "cc-1", "session-id": "codex"}, {}, "cc-1"),
        ({"session-id": "codex-1"}, {"metadata": {"session_id": "meta"}}, "codex-1"),
        ({}, {"metadata": {"session_id": "meta-1"}, "user": "u"}, "meta-1"),
    ],
)
async def test_session_ids_clients_send_come_first(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    sim_server: TestServer,
    headers: dict[str, str],
    body: dict[str, Any],
    expected: str,
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    raw = await send(proxy, [SYSTEM, TASK], headers, **body)
    assert session_of(raw) == expected


async def test_a_conversation_keeps_its_session_turn_after_turn(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    history = [SYSTEM, TASK]
    names = set()
    for turn in range(4):
        raw = await send(proxy, history)
        names.add(session_of(raw))
        retried = await send(proxy, history)  # a client's retry is the same turn again
        names.add(session_of(retried))
        history = [*history, answered(raw), {"role": "user", "content": f"Step {turn}."}]
    assert len(names) == 1


async def test_a_returned_branch_name_sent_back_is_that_conversation(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server)
    first = await send(proxy, [SYSTEM, TASK])
    a = [SYSTEM, TASK, answered(first), {"role": "user", "content": "Go on, A."}]
    b = [SYSTEM, TASK, answered(first), {"role": "user", "content": "Go on, B."}]
    await send(proxy, a)
    branch_b = session_of(await send(proxy, b))
    later = [*b, {"role": "user", "content": "x"}]
    named = await send(proxy, later, {"x-agentproxy-session": branch_b})
    assert session_of(named) == branch_b


# --- diverged conversations share no state ---------------------------------------------------

BUDGET = """
policies:
  - name: metered
    budgets:
      - {name: per-session, limits: {calls: 3}}
"""


async def test_diverged_conversations_have_their_own_budgets(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, BUDGET)
    a1 = await send(proxy, [SYSTEM, TASK])
    b1 = await send(proxy, [SYSTEM, TASK])  # the same request: one conversation so far
    assert session_of(a1) == session_of(b1)
    a = [SYSTEM, TASK, answered(a1), {"role": "user", "content": "Read the parser first."}]
    b = [SYSTEM, TASK, answered(b1), {"role": "user", "content": "Run the tests first."}]
    a2 = await send(proxy, a)  # the third call of A's budget
    b2 = await send(proxy, b)  # B diverged: a budget of its own
    assert session_of(a2) == session_of(a1) != session_of(b2)
    for step in range(2):
        b = [*b, answered(b2), {"role": "user", "content": f"Next {step}."}]
        b2 = await send(proxy, b)
        assert b2.http_response.status_code == 200
    with pytest.raises(openai.RateLimitError) as refused:  # A's own 3 calls are spent
        await send(proxy, [*a, answered(a2), {"role": "user", "content": "Now fix it."}])
    assert refused.value.body["budget"]["spent"] == 3  # type: ignore[index]
    with pytest.raises(openai.RateLimitError):  # and B's
        await send(proxy, [*b, answered(b2), {"role": "user", "content": "Done?"}])


def reading_model(body: dict[str, Any]) -> dict[str, Any]:
    """Reads missing.txt again while it is missing; once a read finds something, the next file."""
    if body.get("tool_choice") == "none":
        return {"role": "assistant", "content": "I cannot read it."}
    results = [m for m in body["messages"] if m.get("role") == "tool"]
    found = results and "ENOENT" not in results[-1]["content"]
    path = f"module_{len(results)}.py" if found else "missing.txt"
    call = {
        "id": f"call_{len(body['messages'])}",
        "type": "function",
        "function": {"name": "read_file", "arguments": f'{{"path": "{path}"}}'},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


LOOPS = """
policies:
  - name: loops
    loops: {enabled: true, window: 5, repeats: 3}
"""


async def test_a_conversation_making_progress_does_not_reset_its_twins_loop_ladder(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    upstream = await aiohttp_server(Simulator(responder=reading_model).app())
    proxy = await start(start_proxy, tmp_path, upstream, LOOPS)

    async def turn(history: list[dict[str, Any]], result: str) -> str:
        try:
            raw = await send(proxy, history, tools=TOOLS)
        except openai.RateLimitError as refused:
            return f"refused {refused.body}"
        message = answered(raw)
        history += [message]
        history += [
            {"role": "tool", "tool_call_id": call["id"], "content": result}
            for call in message.get("tool_calls") or []
        ]
        return str(raw.headers.get("x-agentproxy-applied", ""))

    stuck = [SYSTEM, TASK]
    applied = ""
    while "no_tools" not in applied:  # warn, then no_tools: two rungs of its ladder
        applied = await turn(stuck, "ENOENT")
    stuck.append({"role": "user", "content": "Try again."})
    assert await turn(stuck, "ENOENT") == ""  # no call just happened: nothing judged
    twin = [SYSTEM, TASK]  # same start; its reads find something, so it makes progress
    for step in range(3):
        seen = await turn(twin, f"line {step}: def parse(): ...")
        assert "loops" not in seen and "refused" not in seen, seen
    # The stuck one's next detection climbs to the top rung: the twin's progress was not its.
    assert "loop_detected" in await turn(stuck, "ENOENT")


CIRCUIT = """
policies:
  - name: guarded
    retry: {attempts: 1}
    circuit: {session_failures: 2}
"""


async def test_a_failing_conversation_does_not_open_its_twins_circuit(
    start_proxy: ProxyFactory, tmp_path: Path, aiohttp_server: Any
) -> None:
    sim = Simulator()
    proxy = await start(start_proxy, tmp_path, await aiohttp_server(sim.app()), CIRCUIT)
    first = await send(proxy, [SYSTEM, TASK])
    a = [SYSTEM, TASK, answered(first), {"role": "user", "content": "Apply patch A."}]
    b = [SYSTEM, TASK, answered(first), {"role": "user", "content": "Apply patch B."}]
    sim.inject(Fault(status=400, times=2))
    for _ in range(2):
        with pytest.raises(openai.BadRequestError):
            await send(proxy, a)
    with pytest.raises(openai.RateLimitError):  # A's circuit is open for its request
        await send(proxy, a)
    sim.inject(Fault(status=400, times=2))
    with pytest.raises(openai.BadRequestError):
        await send(proxy, b)
    # B has failed once, in its own circuit: its retry reaches the model (in A's it would be
    # refused, A's circuit having counted three failures).
    with pytest.raises(openai.BadRequestError):
        await send(proxy, b)


async def test_another_key_sending_the_same_conversation_moves_nothing(
    start_proxy: ProxyFactory, tmp_path: Path, sim_server: TestServer
) -> None:
    proxy = await start(start_proxy, tmp_path, sim_server, BUDGET)
    first = await send(proxy, [SYSTEM, TASK])
    history = [SYSTEM, TASK, answered(first), {"role": "user", "content": "Continue."}]
    # Another key sends the very same histories, further along: its own sessions entirely.
    other = await send(proxy, [*history, {"role": "user", "content": "x"}], key="sk-other-0002")
    await send(proxy, [SYSTEM, TASK], key="sk-other-0002")
    again = await send(proxy, history)
    assert session_of(again) == session_of(first)
    assert session_of(other) != session_of(first)
