"""The Gemini view, incremental: a turn lent the session's last view maps only its new contents
(law 7) and sends what a view built afresh would, byte for byte; another key's session of the
same name is lent nothing (law 8); the recording stores each content once."""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.pipeline.repair import RepairStage
from proxy.recording.sessions import recorded_turns
from proxy.sessions.identity import scoped
from proxy.state import RECORDINGS, STORE
from proxy.store.base import RECORDING_KINDS
from proxy.wire.gemini.view import GeminiView
from tests.conftest import ProxyFactory
from tests.pipeline.factories import context, exchange

from .test_gemini import KEY, OTHER, sim, start, upstream

__all__ = ["sim", "upstream"]  # fixtures


def _contents(rng: random.Random, n: int, ids: bool) -> list[dict[str, Any]]:
    """A Gemini CLI-like history: a question, then rounds of calls (with and without ids),
    their responses, answers with signed thoughts."""
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "start"}]}]
    for k in range(n):
        calls = [
            {"functionCall": {"name": f"tool_{j}", "args": {"n": k, "j": j}}}
            for j in range(rng.randint(1, 2))
        ]
        if ids:
            for j, call in enumerate(calls):
                call["functionCall"]["id"] = f"c{k}-{j}"
        signed = {"text": f"thinking {k}", "thought": True, "thoughtSignature": f"sig{k}"}
        contents.append({"role": "model", "parts": [signed, {"text": f"step {k}"}, *calls]})
        responses = [
            {"functionResponse": {**c["functionCall"], "response": {"output": f"out {k}"}}}
            for c in calls
        ]
        for r in responses:
            r["functionResponse"].pop("args")
        extra = [{"text": f"and {k}"}] if rng.random() < 0.3 else []
        contents.append({"role": "user", "parts": [*responses, *extra]})
    return contents


def _turns(seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    rng = random.Random(seed)
    body: dict[str, Any] = {"model": "m", "contents": _contents(rng, rng.randint(0, 5), seed % 2)}
    if rng.random() < 0.7:
        body["systemInstruction"] = {"parts": [{"text": "be brief"}]}
    later = copy.deepcopy(body)
    contents = later["contents"]
    change = rng.choice(["append", "append", "edit", "shorter", "system", "none"])
    if change == "append":
        contents += [
            {"role": "model", "parts": [{"functionCall": {"name": "tool_9", "args": {}}}]},
            {"role": "user", "parts": [{"text": "go on"}]},
        ]
    elif change == "edit":
        at = rng.randrange(len(contents))
        contents[at] = {**contents[at], "parts": [*contents[at]["parts"], {"text": "edited"}]}
    elif change == "shorter":
        later["contents"] = contents[: rng.randint(1, len(contents))]
    elif change == "system":
        if rng.random() < 0.5:
            later.pop("systemInstruction", None)
        else:
            later["systemInstruction"] = {"parts": [{"text": "other"}]}
    return body, later


async def test_a_view_lent_the_last_turns_view_is_the_view_built_afresh() -> None:
    for seed in range(300):
        first, second = _turns(seed)
        previous = GeminiView.of(first)
        lent, fresh = GeminiView.of(second, previous.memory()), GeminiView.of(second)
        assert lent.messages == fresh.messages, seed
        sent = []
        for view in (lent, fresh):  # the same contents upstream, untouched or repaired
            chat = view.chat_body()
            untouched = orjson.dumps(view.render(chat))
            repaired = await RepairStage().run(
                exchange(chat["messages"]), chat["messages"], context()
            )
            changed = repaired or chat["messages"][:-1]
            sent.append((untouched, orjson.dumps(view.render({**chat, "messages": changed}))))
        assert sent[0] == sent[1], seed


def test_the_native_prefix_counts_the_contents_equal_to_the_last_turns() -> None:
    """What the recording takes from the last turn: native contents, never view messages."""
    for seed in range(300):
        first, second = _turns(seed)
        previous = GeminiView.of(first)
        view = GeminiView.of(second, previous.memory())
        prefix = view.native_prefix()
        old, new = first["contents"], second["contents"]
        equal = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), None)
        shared = min(len(old), len(new)) if equal is None else equal
        assert prefix.key == "contents" and prefix.shared == shared, seed
        assert view.fresh == shared, seed  # only the rest was mapped
        base = previous.native_prefix().turn if shared else None
        assert prefix.base is base and prefix.turn is not previous.native_prefix().turn, seed


def test_the_shared_contents_are_the_previous_views_very_messages() -> None:
    first, _ = _turns(4)
    second = copy.deepcopy(first)
    second["contents"] += [
        {"role": "model", "parts": [{"text": "ok"}]},
        {"role": "user", "parts": [{"text": "go"}]},
    ]
    previous = GeminiView.of(first)
    view = GeminiView.of(second, previous.memory())
    shared = len(previous.messages)
    assert all(a is b for a, b in zip(view.messages[:shared], previous.messages, strict=True))
    assert len(view.messages) == shared + 2


def test_an_untouched_turn_lent_a_view_sends_this_turns_own_contents() -> None:
    """Equal is not identical (1 == 1.0): what goes upstream is always this turn's bytes."""
    first, _ = _turns(6)
    first["contents"][0]["parts"][0]["extra"] = 1.0
    second = copy.deepcopy(first)
    second["contents"][0]["parts"][0]["extra"] = 1
    view = GeminiView.of(second, GeminiView.of(first).memory())
    assert view.fresh == len(second["contents"])
    out = view.render({**view.chat_body(), "messages": view.messages[:-1]})
    assert out["contents"][0] is second["contents"][0]


async def _generate(
    http: aiohttp.ClientSession, proxy: TestServer, key: str, body: dict[str, Any]
) -> dict[str, Any]:
    url = proxy.make_url("/v1beta/models/gemini-native:generateContent")
    headers = {"x-goog-api-key": key, "x-agentproxy-session": "long"}
    async with http.post(url, json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def test_each_turn_maps_only_its_new_contents_and_another_key_is_lent_nothing(
    start_proxy: ProxyFactory,
    tmp_path: Path,
    upstream: TestServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mapped: list[int] = []
    real = GeminiView._map

    def counted(view: GeminiView, index: int, content: dict[str, Any]) -> None:
        mapped[-1] += 1
        real(view, index, content)

    monkeypatch.setattr(GeminiView, "_map", counted)
    proxy = await start(start_proxy, tmp_path, upstream)
    contents: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as http:
        for turn in range(20):
            contents.append({"role": "user", "parts": [{"text": f"step {turn}"}]})
            mapped.append(0)
            answer = await _generate(http, proxy, KEY, {"contents": contents})
            contents.append(answer["candidates"][0]["content"])
        # the first turn maps its one content; each later one the answer and the new question
        assert mapped == [1] + [2] * 19
        mapped.append(0)  # another key, the same session id and history: nothing lent
        await _generate(http, proxy, OTHER, {"contents": contents[:-1]})
        assert mapped[-1] == len(contents) - 1


async def test_a_recorded_session_stores_each_content_once(
    start_proxy: ProxyFactory, tmp_path: Path, upstream: TestServer
) -> None:
    policies = "policies:\n  - name: kept\n    record: {enabled: true}\n"
    proxy = await start(start_proxy, tmp_path, upstream, policies=policies)
    store, name = proxy.app[STORE], scoped("key:agent", "long")
    contents: list[dict[str, Any]] = []
    sizes: list[int] = []
    async with aiohttp.ClientSession() as http:
        for turn in range(30):
            contents.append({"role": "user", "parts": [{"text": f"step {turn}: " + "y" * 500}]})
            body = {"systemInstruction": {"parts": [{"text": "s" * 2000}]}, "contents": contents}
            answer = await _generate(http, proxy, KEY, body)
            contents.append(answer["candidates"][0]["content"])
            await proxy.app[RECORDINGS].flush()
            blobs = await store.blobs(name)
            sizes.append(sum(b.size for b in blobs if b.kind in RECORDING_KINDS))
    per_turn = [after - before for before, after in itertools.pairwise(sizes)]
    early, late = sum(per_turn[3:8]) / 5, sum(per_turn[-5:]) / 5
    assert late <= early * 1.1  # the thirtieth turn costs what the fifth did
    # each content hashed once (the question and the answer of each turn), not every turn
    assert proxy.app[RECORDINGS].hashed <= 2 * 30 + 1
    turns: list[dict[str, Any]] = []
    for _ in range(100):
        turns = await recorded_turns(store, name)
        if len(turns) == 30:
            break
        await asyncio.sleep(0.01)
    assert len(turns) == 30 and turns[-1]["request"]["contents"] == contents[:-1]
