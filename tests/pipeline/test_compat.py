"""The per-deployment compatibility shim: null contents emptied where the server needs it."""

from __future__ import annotations

import dataclasses

from proxy.pipeline.compat import (
    CompatStage,
    Quirks,
    complains_of_null_content,
    empty_null_contents,
)
from tests.pipeline.factories import context, deployment, exchange
from tests.support.sim_llama import validation_error

CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}
HISTORY = [{"role": "user", "content": "go"}, CALL, {"role": "tool", "tool_call_id": "c1",
           "content": None}, {"role": "assistant", "content": "done"}]  # fmt: skip
REFUSAL = str(validation_error([1])).encode()


def test_only_assistant_null_contents_are_emptied_and_the_rest_reused() -> None:
    out, changed = empty_null_contents(HISTORY)
    assert changed == 1 and out[1] == {**CALL, "content": ""}
    assert out[0] is HISTORY[0] and out[2] is HISTORY[2] and out[3] is HISTORY[3]
    assert HISTORY[1]["content"] is None  # the client's message is not mutated
    assert empty_null_contents(out) == (out, 0)  # idempotent


def test_a_refusal_names_the_null_content_or_it_does_not() -> None:
    assert complains_of_null_content(REFUSAL)
    assert complains_of_null_content(b'can only concatenate str (not "NoneType") to content')
    assert not complains_of_null_content(b'{"error": {"message": "model not found"}}')


def test_learnt_once_per_deployment_address_and_never_against_a_declaration() -> None:
    quirks, target = Quirks(), deployment()
    assert not quirks.needs_empty_content(target)
    assert not quirks.learn(target, b'{"error": "unrelated"}', HISTORY)
    assert not quirks.learn(target, REFUSAL, HISTORY[:1])  # nothing null was sent
    assert quirks.learn(target, REFUSAL, HISTORY)
    assert quirks.needs_empty_content(dataclasses.replace(target))  # a reload's new object
    assert not quirks.needs_empty_content(deployment(alias="other"))
    assert quirks.learn(target, b"", HISTORY)  # known: any refusal of a null content
    takes_null = dataclasses.replace(target, supports_null_content=True)
    assert not quirks.needs_empty_content(takes_null)
    assert not quirks.learn(takes_null, REFUSAL, HISTORY)
    declared = dataclasses.replace(deployment(alias="x"), supports_null_content=False)
    assert Quirks().needs_empty_content(declared)


async def test_the_stage_shims_only_a_deployment_that_needs_it_and_says_so() -> None:
    quirks = Quirks()
    stage, ctx = CompatStage(quirks), context()
    ex = exchange(HISTORY)
    assert await stage.run(ex, HISTORY, ctx) is None and ex.notes == []
    assert ex.deployment is not None
    quirks.learn(ex.deployment, REFUSAL, HISTORY)
    out = await stage.run(ex, HISTORY, ctx)
    assert out is not None and out[1]["content"] == ""
    assert [(n.stage, n.action, n.fields) for n in ex.notes] == [
        ("compat", "emptied_null_content", {"count": 1})
    ]
