"""Session activity: a cold session touches the store before its request goes on, warm ones
cost a dict update and are flushed in batches, idle ones are forgotten everywhere."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from proxy.sim.simulator import Simulator
from proxy.store.activity import Activity
from proxy.store.base import BlobInfo, StoreError, content_ref
from proxy.store.local import LocalStore
from proxy.store.retention import Collected, Pressure, StoreStats


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Touches:
    """Records touches; `gate` holds them until set, `fail` makes them raise."""

    def __init__(self) -> None:
        self.pressure = Pressure(None)
        self.batches: list[dict[str, float]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def touch(self, sessions: Mapping[str, float]) -> None:
        await self.gate.wait()
        if self.fail:
            raise StoreError("redis 127.0.0.1:6379: touch failed")
        self.batches.append(dict(sessions))

    async def collect(self, *, expire_before: float, live_after: float) -> Collected:
        return Collected()

    async def stats(self, *, live_after: float) -> StoreStats:
        raise NotImplementedError


def tracker(touches: Touches, forgotten: list[set[str]], clock: Clock, **options: int) -> Activity:
    return Activity(touches, forgotten.append, live_s=3600, clock=clock, **options)


async def test_a_cold_session_touches_the_store_first_and_a_warm_one_does_not() -> None:
    touches, forgotten, clock = Touches(), [], Clock()
    activity = tracker(touches, forgotten, clock)
    cold = activity.arrive("key:a/s1")
    assert cold is not None
    await cold
    activity.leave("key:a/s1")
    assert touches.batches == [{"key:a/s1": clock.now}]
    clock.now += 5
    assert activity.arrive("key:a/s1") is None  # warm: nothing to wait for
    activity.leave("key:a/s1")
    await activity.flush()
    assert touches.batches[-1] == {"key:a/s1": clock.now}
    await activity.flush()
    assert len(touches.batches) == 2, "nothing new: no write"


async def test_a_second_request_of_a_cold_session_waits_for_the_same_touch() -> None:
    touches, clock = Touches(), Clock()
    activity = tracker(touches, [], clock)
    touches.gate.clear()
    first = activity.arrive("key:a/s1")
    second = activity.arrive("key:a/s1")
    assert first is not None and second is not None
    waiting = asyncio.ensure_future(second)
    await asyncio.sleep(0.01)
    assert not waiting.done(), "it must not read the store before the touch is in"
    touches.gate.set()
    await asyncio.gather(first, waiting)
    assert touches.batches == [{"key:a/s1": clock.now}]  # one touch for both


async def test_a_failing_touch_lets_the_request_go_on() -> None:
    touches, clock = Touches(), Clock()
    touches.fail = True
    activity = tracker(touches, [], clock)
    cold = activity.arrive("key:a/s1")
    assert cold is not None
    await cold  # no exception: the request degrades where it uses the store
    await activity.flush()


async def test_idle_sessions_are_forgotten_after_half_of_live_s_and_come_back_cold() -> None:
    touches, forgotten, clock = Touches(), [], Clock()
    activity = tracker(touches, forgotten, clock)
    for session in ("key:a/old", "key:a/new"):
        cold = activity.arrive(session)
        assert cold is not None
        await cold
        if session == "key:a/old":
            activity.leave(session)
        clock.now += 1000
    activity.leave("key:a/new")  # its long request just ended
    clock.now += 900  # old: idle 1900 s > 1800; new: 900 s
    assert activity.sweep() == {"key:a/old"}
    assert forgotten == [{"key:a/old"}] and len(activity) == 1
    assert activity.arrive("key:a/old") is not None, "cold again: it touches the store"


async def test_past_its_bound_the_least_recent_session_is_forgotten() -> None:
    forgotten: list[set[str]] = []
    activity = tracker(Touches(), forgotten, Clock(), max_sessions=2)
    for n in range(3):
        cold = activity.arrive(f"key:a/s{n}")
        assert cold is not None
        await cold
        activity.leave(f"key:a/s{n}")
    assert forgotten == [{"key:a/s0"}] and len(activity) == 2


async def test_a_touch_in_the_store_keeps_a_session_from_a_collection(tmp_path: Path) -> None:
    """The race the cold touch closes, on a real store: a session idle past its TTL comes
    back; once the touch is in, a collection that judged it by its old time keeps it."""
    store = LocalStore(str(tmp_path))
    clock = Clock()
    clock.now = 2_000_000_000.0
    info = BlobInfo(content_ref("key:a/s", "tool_result", b"x"), "key:a/s", "tool_result", 1,
                    clock.now - 30 * 86400, "key:a", {})  # fmt: skip
    try:
        await store.put(info, b"x")
        activity = Activity(store, lambda _: None, live_s=3600, clock=clock)
        cold = activity.arrive("key:a/s")
        assert cold is not None
        await cold
        done = await store.collect(expire_before=clock.now - 7 * 86400, live_after=clock.now)
        assert done.expired == () and await store.get(info.ref) is not None
    finally:
        await store.close()


async def test_a_session_in_flight_is_reported_active_and_never_forgotten() -> None:
    touches, forgotten, clock = Touches(), [], Clock()
    activity = tracker(touches, forgotten, clock)
    cold = activity.arrive("key:a/streaming")
    assert cold is not None
    await cold
    clock.now += 7200  # a two-hour stream
    assert activity.sweep() == set() and forgotten == []
    await activity.flush()
    assert touches.batches[-1] == {"key:a/streaming": clock.now}
    activity.leave("key:a/streaming")
    clock.now += 1801
    assert activity.sweep() == {"key:a/streaming"}


async def test_a_refused_request_is_not_left_in_flight(proxy_for: Any, sim: Any) -> None:
    """A guard refusal ends the request before it is finished: it must still leave."""
    import aiohttp

    from proxy.state import FLOW

    policy = (
        "policies:\n  - {name: one-call, budgets: [{name: one, scope: key, limits: {calls: 1}}]}\n"
    )
    proxy = await proxy_for(sim, policy)
    ask = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
    statuses = []
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(str(proxy.make_url("/v1/chat/completions")), json=ask) as r:
                statuses.append(r.status)
    assert statuses[0] == 200 and statuses[1:] != [200, 200], statuses
    activity = proxy.app[FLOW].activity
    assert activity is not None and activity.in_flight == 0


async def test_memo_idle_s_forgets_a_session_sooner_than_live_s() -> None:
    forgotten: list[set[str]] = []
    clock = Clock()
    activity = Activity(Touches(), forgotten.append, live_s=3600, memo_idle_s=600, clock=clock)
    cold = activity.arrive("key:a/s1")
    assert cold is not None
    await cold
    activity.leave("key:a/s1")
    clock.now += 599
    assert activity.sweep() == set()
    clock.now += 2
    assert activity.sweep() == {"key:a/s1"} and forgotten == [{"key:a/s1"}]


async def test_an_idle_session_leaves_the_proxys_memory_and_its_next_turn_is_the_same(
    proxy_for: Any,
) -> None:
    """Over sockets: with memo_idle_s 1 the memos hold nothing of a session a second after
    its last turn; its next turn sends the upstream the very bytes a warm one would have."""
    sim = Simulator()
    proxy = await proxy_for(sim, "server: {memo_idle_s: 1}\n")
    url = str(proxy.make_url("/v1/chat/completions"))
    headers = {"x-agentproxy-session": "idle-1"}
    big = "\n".join(f"line {n}: " + "x" * 60 for n in range(900))  # offloaded: > 20k chars
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "read the log"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": big},
    ]  # fmt: skip
    async with aiohttp.ClientSession() as http:

        async def turn(text: str) -> None:
            history.append({"role": "user", "content": text})
            body = {"model": "sim", "messages": history}
            async with http.post(url, json=body, headers=headers) as response:
                assert response.status == 200, await response.text()
                answer = await response.json()
            history.append(answer["choices"][0]["message"])

        async def histories_bytes() -> float:
            async with http.get(proxy.make_url("/metrics")) as response:
                text = await response.text()
            return float(re.findall(r'agentproxy_memo_bytes\{memo="histories"\} (\S+)', text)[0])

        await turn("go on")
        await turn("and again")
        assert await histories_bytes() > 0
        warm = sim.requests[-1].body["messages"]
        await asyncio.sleep(1.8)  # idle 1 s, swept every 0.25 s
        assert await histories_bytes() == 0
        history.pop()  # the same turn again, now cold
        history.pop()
        await turn("and again")
    assert sim.requests[-1].body["messages"] == warm
