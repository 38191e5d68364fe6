"""Starting a coroutine in the caller's task: no task when it never waits; the rest in a task,
outcomes and all, when it does."""

from __future__ import annotations

import asyncio

import pytest

from proxy import eager


async def test_a_coroutine_that_never_waits_runs_at_once_without_a_task() -> None:
    done: list[str] = []

    async def inner() -> None:
        done.append("inner")

    async def settle() -> None:
        await inner()  # awaits, but nothing that waits
        done.append("settled")

    tasks = len(asyncio.all_tasks())
    assert eager.start(settle()) is None
    assert done == ["inner", "settled"]
    assert len(asyncio.all_tasks()) == tasks


async def test_an_exception_before_any_wait_is_raised_at_once() -> None:
    async def fails() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        eager.start(fails())


async def test_a_coroutine_that_waits_goes_on_in_a_task_with_every_outcome() -> None:
    loop = asyncio.get_running_loop()
    given: asyncio.Future[int] = loop.create_future()
    failing: asyncio.Future[int] = loop.create_future()
    seen: list[object] = []

    async def settle() -> None:
        seen.append("started")
        seen.append(await given)
        await asyncio.sleep(0)  # a bare yield
        try:
            await failing
        except KeyError as exc:
            seen.append(f"caught {exc}")
        seen.append("ended")

    rest = eager.start(settle())
    assert rest is not None and seen == ["started"]  # ran up to its first wait, here
    given.set_result(7)
    await asyncio.sleep(0.01)
    assert seen == ["started", 7]
    failing.set_exception(KeyError("gone"))
    await asyncio.wait_for(rest, 1)
    assert seen == ["started", 7, "caught 'gone'", "ended"]


async def test_the_rest_runs_to_its_end_when_its_waiter_is_cancelled() -> None:
    """As with asyncio.shield: a handler cancelled meanwhile does not stop the settling."""
    gate = asyncio.Event()
    seen: list[str] = []

    async def settle() -> None:
        await gate.wait()
        seen.append("settled")

    rest = eager.start(settle())
    assert rest is not None
    waiter = asyncio.ensure_future(asyncio.shield(rest))
    await asyncio.sleep(0)
    waiter.cancel()
    gate.set()
    await asyncio.wait_for(rest, 1)
    assert seen == ["settled"]
