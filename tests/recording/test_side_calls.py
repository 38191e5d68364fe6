"""A side call is not a client turn: an agent's title or topic request in the session of its
main conversation (a fresh conversation with another system prompt, as opencode and Claude
Code send) counts as a call of the turn it happens in, marked `side` on the timeline, whether
the session is recorded (its index row and timeline) or not (the board's). Over real sockets,
with the openai SDK; a second key sending the same session id keeps its own count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
from aiohttp.test_utils import TestServer

from proxy.state import RECORDINGS
from tests.conftest import ProxyFactory

from .test_recording import ALICE, BOB, chat, session, start

MAIN = "You are a coding agent. Use the tools to answer the user's questions."
TITLE = "You are a title generator. Answer with a title of at most five words."


async def listed(proxy: TestServer, key: str) -> dict[str, dict[str, Any]]:
    """The key's sessions by the name the client sent, each as GET /admin/sessions/{id} shows
    it (its figures and timeline)."""
    await proxy.app[RECORDINGS].flush()
    headers = {"Authorization": f"Bearer {key}"}
    found = {}
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/admin/sessions"), headers=headers) as r:
            rows = (await r.json())["data"]
        for row in rows:
            async with http.get(
                proxy.make_url(f"/admin/sessions/{row['id']}"), headers=headers
            ) as r:
                found[row["session"]] = {**row, "shown": await r.json()}
    return found


@pytest.mark.parametrize("record", ["{enabled: true}", "{enabled: false}"])
async def test_a_title_request_beside_the_main_conversation_is_a_side_call_not_a_turn(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, record: str
) -> None:
    proxy = await start(
        start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}", record=record
    )
    alice, bob = chat(proxy, ALICE), chat(proxy, BOB)
    turn1: list[Any] = [
        {"role": "system", "content": MAIN},
        {"role": "user", "content": "list the files here"},
    ]
    first = await alice.chat.completions.create(
        model="sim", messages=turn1, extra_headers=session("work")
    )
    title = [
        {"role": "system", "content": TITLE},
        {"role": "user", "content": "Generate a title for this conversation"},
    ]
    await alice.chat.completions.create(model="sim", messages=title, extra_headers=session("work"))
    answer = {"role": "assistant", "content": first.choices[0].message.content}
    turn2 = [*turn1, answer, {"role": "user", "content": "and the tests?"}]
    await alice.chat.completions.create(model="sim", messages=turn2, extra_headers=session("work"))
    # Bob's session of the same name: his own first call, then his own title request.
    await bob.chat.completions.create(
        model="sim", messages=turn1[1:], extra_headers=session("work")
    )
    await bob.chat.completions.create(model="sim", messages=title, extra_headers=session("work"))

    mine = (await listed(proxy, ALICE))["work"]
    assert (mine["turns"], mine["calls"]) == (2, 3)
    rows = mine["shown"]["timeline"]
    assert mine["shown"]["source"] == ("recording" if "true" in record else "board")
    assert [(r["turn"], r["opens"], r.get("side", False)) for r in rows] == [
        (1, True, False),
        (1, False, True),
        (2, True, False),
    ]
    theirs = await listed(proxy, BOB)
    assert list(theirs) == ["work"]
    his = theirs["work"]
    assert (his["turns"], his["calls"]) == (1, 2) and his["id"] != mine["id"]
    assert [r.get("side", False) for r in his["shown"]["timeline"]] == [False, True]


async def test_claude_codes_topic_request_is_a_side_call_and_its_next_prompt_a_turn(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    """Anthropic's wire, as Claude Code sends it: the system prompt outside the messages, its
    first block a header that changes from call to call, the first user message reminders
    and the prompt, cache markers moving; the topic request asks about the prompt alone."""
    proxy = await start(start_proxy, aiohttp_server, tmp_path, f"path: {tmp_path / 'data'}")
    client = anthropic.AsyncAnthropic(
        base_url=str(proxy.make_url("")).rstrip("/"), api_key=ALICE, max_retries=0
    )

    def system(index: int) -> list[dict[str, Any]]:
        header = f"x-anthropic-billing-header: cc_version=2.1; cc_prev_turn_index={index};"
        return [{"type": "text", "text": header}, {"type": "text", "text": MAIN}]

    marker = {"type": "ephemeral"}
    reminder = {"type": "text", "text": "<system-reminder>the date is today</system-reminder>"}
    ask = {"type": "text", "text": "list the files here"}
    first = await client.messages.create(
        model="claude", max_tokens=100, system=system(0),  # type: ignore[arg-type]
        messages=[{"role": "user", "content": [reminder, {**ask, "cache_control": marker}]}],
        extra_headers=session("cc"),
    )  # fmt: skip
    await client.messages.create(
        model="claude", max_tokens=100, system=TITLE,
        messages=[{"role": "user", "content": "list the files here"}],
        extra_headers=session("cc"),
    )  # fmt: skip
    said = [{"type": "text", "text": first.content[0].text}]  # type: ignore[union-attr]
    again = [
        {"role": "user", "content": [reminder, ask]},
        {"role": "assistant", "content": said},
        {"role": "user", "content": [
            {"type": "text", "text": "and the tests?", "cache_control": marker}]},
    ]  # fmt: skip
    await client.messages.create(
        model="claude", max_tokens=100, system=system(1),  # type: ignore[arg-type]
        messages=again, extra_headers=session("cc"),
    )  # fmt: skip
    mine = (await listed(proxy, ALICE))["cc"]
    assert (mine["turns"], mine["calls"]) == (2, 3)
    rows = mine["shown"]["timeline"]
    assert [(r["turn"], r.get("side", False)) for r in rows] == [(1, False), (1, True), (2, False)]
