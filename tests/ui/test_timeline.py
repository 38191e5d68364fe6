"""What the inspector reads, over real sockets with an admin key configured: the sessions
list scoped by key (the admin sees every tenant, a client key its own, no key nothing), and a
recorded turn's archived items beside what the model saw instead (an offload's pointer)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp.test_utils import TestServer

from proxy.recording.sessions import recorded_turns
from proxy.sessions.identity import scoped
from proxy.sim.simulator import Simulator
from proxy.state import RECORDINGS, STORE
from tests.conftest import ProxyFactory

ADMIN, ALICE, BOB = "admin-secret", "sk-alice-0001", "sk-bob-00002"
BIG = "\n".join(f"line {i}: the full tool output" for i in range(400))


async def start(start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path) -> TestServer:
    upstream: TestServer = await aiohttp_server(Simulator(context_window=50_000).app())
    url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "agentproxy.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            keys:
              admin_key: {ADMIN}
              api_keys: [{{name: alice, key: {ALICE}}}, {{name: bob, key: {BOB}}}]
            store: {{path: {tmp_path / "data"}}}
            model_list:
              - model_name: sim
                litellm_params: {{model: openai/sim, api_base: "{url}/v1"}}
            policies:
              - name: recorded
                record: {{enabled: true}}
                offload: {{min_tokens: 500}}
            """
        )
    )
    return await start_proxy(path)


async def ask(proxy: TestServer, key: str, messages: list[dict[str, Any]]) -> None:
    headers = {"Authorization": f"Bearer {key}", "x-agentproxy-session": "shared"}
    async with aiohttp.ClientSession() as http:
        url, body = proxy.make_url("/v1/chat/completions"), {"model": "sim", "messages": messages}
        async with http.post(url, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()


async def get(proxy: TestServer, path: str, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url(path), headers=headers) as r:
            return r.status, await r.json()


async def test_the_admin_sees_every_tenant_a_client_key_its_own_no_key_nothing(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path)
    await ask(proxy, ALICE, [{"role": "user", "content": "alice's plan"}])
    await ask(proxy, BOB, [{"role": "user", "content": "bob's plan"}])  # the same session id
    assert (await get(proxy, "/admin/sessions"))[0] == 401  # loopback too: there is a key
    _, everyone = await get(proxy, "/admin/sessions", ADMIN)
    ids = {row["key"]: row["id"] for row in everyone["data"]}
    assert set(ids) == {"alice", "bob"}
    _, alices = await get(proxy, "/admin/sessions", ALICE)
    assert [(row["session"], row["key"]) for row in alices["data"]] == [("shared", "alice")]
    assert (await get(proxy, f"/admin/sessions/{ids['bob']}", ALICE))[0] == 404
    assert (await get(proxy, f"/admin/sessions/{ids['bob']}", ADMIN))[0] == 200
    assert (await get(proxy, f"/admin/sessions/{ids['alice']}"))[0] == 401


async def test_an_offload_shows_its_ref_the_archived_text_and_the_pointer_the_model_saw(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    proxy = await start(start_proxy, aiohttp_server, tmp_path)
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    await ask(
        proxy, ALICE,
        [{"role": "user", "content": "read it"},
         {"role": "assistant", "content": None, "tool_calls": [call]},
         {"role": "tool", "tool_call_id": "c1", "content": BIG}],
    )  # fmt: skip
    await proxy.app[RECORDINGS].flush()
    _, listed = await get(proxy, "/admin/sessions", ADMIN)
    _, shown = await get(proxy, f"/admin/sessions/{listed['data'][0]['id']}", ADMIN)
    [event] = [e for e in shown["timeline"][0]["events"] if e["stage"] == "offload"]
    [ref] = event["refs"]
    assert ref in event["seen"][ref] and "line 0: the full tool output" in event["seen"][ref]
    assert "line 200:" not in event["seen"][ref]  # a preview, not the whole
    status, archived = await get(proxy, f"/v1/agentproxy/archive/{ref}", ADMIN)
    assert status == 200 and archived["content"] == BIG  # the admin reads alice's archive
    assert (await get(proxy, f"/v1/agentproxy/archive/{ref}", BOB))[0] == 404


# --- the timeline in pages ------------------------------------------------------------------

LONG = "\n".join(f"step {i}: what the tool printed, at some length" for i in range(80))  # ~4 KB


async def start_long(start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path) -> TestServer:
    """Alice and bob, every turn recorded, a window wide enough for a long history."""
    upstream: TestServer = await aiohttp_server(Simulator(context_window=4_000_000).app())
    url = str(upstream.make_url("")).rstrip("/")
    path = tmp_path / "agentproxy.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            keys:
              admin_key: {ADMIN}
              api_keys: [{{name: alice, key: {ALICE}}}, {{name: bob, key: {BOB}}}]
            store: {{path: {tmp_path / "data"}}}
            model_list:
              - model_name: sim
                litellm_params: {{model: openai/sim, api_base: "{url}/v1"}}
                model_info: {{max_input_tokens: 4000000}}
            policies:
              - name: recorded
                record: {{enabled: true}}
            """
        )
    )
    return await start_proxy(path)


async def grow(proxy: TestServer, turns: int, text: str, session: str = "long") -> None:
    """One session of `turns` turns, each re-sending the whole history and one more message."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    headers = {"Authorization": f"Bearer {ALICE}", "x-agentproxy-session": session}
    async with aiohttp.ClientSession() as http:
        for turn in range(turns):
            history.append({"role": "user", "content": f"turn {turn}\n{text}"})
            body = {"model": "sim", "messages": history}
            async with http.post(proxy.make_url("/v1/chat/completions"), json=body,
                                 headers=headers) as r:  # fmt: skip
                assert r.status == 200, await r.text()
                history.append((await r.json())["choices"][0]["message"])
    await proxy.app[RECORDINGS].flush()


async def read(proxy: TestServer, path: str) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url(path), headers=headers) as r:
            return r.status, await r.read()


async def session_path(proxy: TestServer, name: str = "long") -> str:
    _, listed = await get(proxy, "/admin/sessions", ADMIN)
    return "/admin/sessions/" + next(s["id"] for s in listed["data"] if s["session"] == name)


async def test_the_timeline_comes_in_pages_of_a_default_and_at_most_a_maximum_size(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from proxy.routes import sessions as route

    monkeypatch.setattr(route, "DEFAULT_TURNS", 4)
    monkeypatch.setattr(route, "MAX_TURNS", 6)
    proxy = await start_long(start_proxy, aiohttp_server, tmp_path)
    await grow(proxy, 9, "short")
    path = await session_path(proxy)

    def numbers(page: dict[str, Any]) -> list[int]:
        return [row["call"] for row in page["timeline"]]

    _, first = await get(proxy, path, ADMIN)  # the default: DEFAULT_TURNS from the first
    assert numbers(first) == [1, 2, 3, 4] and first["has_more"] and first["next_after"] == 4
    assert first["turns"] == 9 and first["source"] == "recording"
    _, second = await get(proxy, f"{path}?after=4&limit=3", ADMIN)
    assert numbers(second) == [5, 6, 7] and second["next_after"] == 7
    _, last = await get(proxy, f"{path}?after=7&limit=3", ADMIN)
    assert numbers(last) == [8, 9] and not last["has_more"] and last["next_after"] is None
    _, clamped = await get(proxy, f"{path}?limit=1000", ADMIN)  # past MAX_TURNS: MAX_TURNS
    assert numbers(clamped) == [1, 2, 3, 4, 5, 6] and clamped["next_after"] == 6
    _, beyond = await get(proxy, f"{path}?after=50", ADMIN)
    assert beyond["timeline"] == [] and not beyond["has_more"]
    for bad in ("limit=0", "limit=-2", "limit=many", "after=-1", "after=1.5", "after="):
        status, refused = await get(proxy, f"{path}?{bad}", ADMIN)
        name = bad.partition("=")[0]
        assert status == 400 and name in refused["error"]["message"], (bad, refused)


async def test_a_long_sessions_full_timeline_is_read_in_bounded_pages_that_add_up_to_it(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path
) -> None:
    from proxy.routes.sessions import PAGE_BYTES

    proxy = await start_long(start_proxy, aiohttp_server, tmp_path)
    turns = 70  # a history growing ~4 KB a turn: the whole timeline ~20 MB, the store 0.3 MB
    await grow(proxy, turns, LONG)
    path = await session_path(proxy)
    whole = await recorded_turns(proxy.app[STORE], scoped("key:alice", "long"))
    expanded = sum(len(orjson.dumps(t["request"])) + len(orjson.dumps(t["sent"])) for t in whole)
    assert expanded > 4 * PAGE_BYTES  # what one unbounded answer would have been

    status, raw = await read(proxy, f"{path}?full=1&limit=1000")
    assert status == 200 and len(raw) < PAGE_BYTES + 300_000, len(raw)  # one turn past, at most
    after, rows, pages = 0, [], 0
    while after is not None:
        _, raw = await read(proxy, f"{path}?full=1&limit=1000&after={after}")
        page = orjson.loads(raw)
        assert len(raw) < PAGE_BYTES + 300_000 and page["timeline"]
        rows += page["timeline"]
        after, pages = page["next_after"], pages + 1
    assert pages > 3 and [row["call"] for row in rows] == list(range(1, turns + 1))
    for row, turn in zip(rows, whole, strict=True):  # each turn's bodies, as recorded
        assert row["request"] == turn["request"] and row["sent"] == turn["sent"]
        # The context figures come from the stored parts' sizes: the bodies' JSON, in tokens.
        assert row["context"] == {
            "received": len(orjson.dumps(turn["request"])) // 4,
            "sent": len(orjson.dumps(turn["sent"])) // 4,
        }
    # Without bodies: every turn at once, each with its new messages and its answer (the last
    # answer and the new prompt in, the answer out: ~12 KB), never the history before them.
    _, light = await read(proxy, path + "?limit=1000")
    assert len(orjson.loads(light)["timeline"]) == turns and len(light) < turns * 16_000


async def test_one_tenant_making_many_sessions_leaves_anothers_on_the_board(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from proxy.routes import sessions
    from proxy.sessions import board

    monkeypatch.setattr(board, "SESSIONS", 20)
    monkeypatch.setattr(sessions, "LISTED_MAX", 20)  # recorded ones: the store's index
    proxy = await start(start_proxy, aiohttp_server, tmp_path)
    await ask(proxy, ALICE, [{"role": "user", "content": "alice's plan"}])  # session "shared"
    url = proxy.make_url("/v1/chat/completions")
    async with aiohttp.ClientSession() as http:
        for i in range(60):  # three times what the board holds, "shared" among them
            name = "shared" if i % 10 == 0 else f"bob-{i}"
            headers = {"Authorization": f"Bearer {BOB}", "x-agentproxy-session": name}
            body = {"model": "sim", "messages": [{"role": "user", "content": f"bob {i}"}]}
            async with http.post(url, json=body, headers=headers) as r:
                assert r.status == 200
    _, alices = await get(proxy, "/admin/sessions", ALICE)
    assert [(row["session"], row["key"]) for row in alices["data"]] == [("shared", "alice")]
    _, everyone = await get(proxy, "/admin/sessions", ADMIN)
    keys = [row["key"] for row in everyone["data"]]
    assert len(keys) <= 20 and "alice" in keys and keys.count("bob") >= 15
    assert everyone["data"][0]["session"] == "bob-59"  # bob's newest are the ones kept
    # Calls a millisecond apart, some listed by the board (their turns on their way to the
    # index) and some by the index: in the order they came whatever lists them.
    newest = [row["session"] for row in everyone["data"] if row["key"] == "bob"][:5]
    assert newest == [f"bob-{i}" for i in range(59, 54, -1)], newest
    await proxy.app[RECORDINGS].flush()  # every row now the index's: the same rows
    _, indexed = await get(proxy, "/admin/sessions", ADMIN)
    assert {row["source"] for row in indexed["data"]} == {"recording"}
    assert [row["session"] for row in indexed["data"]] == [
        row["session"] for row in everyone["data"]
    ]


async def test_a_session_whose_newest_call_is_on_its_way_to_the_index_is_listed_as_recent(
    start_proxy: ProxyFactory, aiohttp_server: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from proxy.recording import sessions as recording

    proxy = await start(start_proxy, aiohttp_server, tmp_path)
    writer = proxy.app[RECORDINGS]
    url = proxy.make_url("/v1/chat/completions")
    async with aiohttp.ClientSession() as http:

        async def call(name: str, text: str) -> None:
            headers = {"Authorization": f"Bearer {BOB}", "x-agentproxy-session": name}
            body = {"model": "sim", "messages": [{"role": "user", "content": text}]}
            async with http.post(url, json=body, headers=headers) as r:
                assert r.status == 200

        await call("early", "first")
        await call("late", "second")
        await writer.flush()  # both in the index: "late" the more recent
        monkeypatch.setattr(recording, "LINGER_S", 3.0)  # the next write waits a while
        await call("early", "first again")  # newest now, on its way to the index
    _, pending = await get(proxy, "/admin/sessions", BOB)
    assert [row["session"] for row in pending["data"]] == ["early", "late"]
    assert pending["data"][0]["calls"] == 1  # the index's figures: the call not in yet
    await writer.flush()
    _, indexed = await get(proxy, "/admin/sessions", BOB)
    assert [row["session"] for row in indexed["data"]] == ["early", "late"]
    assert indexed["data"][0]["calls"] == 2
    assert indexed["data"][0]["last_at"] == pending["data"][0]["last_at"]  # one time, both
