"""Which wire a summary goes in, and each wire's one-shot request and answer (end to end over
real sockets: tests/routes/test_summary_wire.py)."""

from __future__ import annotations

import dataclasses
import itertools

import orjson

from proxy.app import summary_wires
from proxy.pipeline.compaction.summary_wire import SummaryWires
from proxy.policies.spec import Deployment, ServerSettings
from proxy.upstream.facts import DeploymentFacts
from proxy.upstream.pool import Upstreams
from proxy.wire.anthropic.one_shot import ONE_SHOT as ANTHROPIC
from proxy.wire.registry import WIRES
from proxy.wire.responses.one_shot import ONE_SHOT as RESPONSES
from proxy.wire.responses.one_shot import REASONING_ALLOWANCE
from proxy.wire.responses.upstream import no_responses

NOT_FOUND = orjson.dumps({"detail": "Not Found"})
MODEL_NOT_FOUND = orjson.dumps(
    {"error": {"message": "no such model", "type": "invalid_request_error",
               "code": "model_not_found"}}
)  # fmt: skip
PORTS = itertools.count(20_000)  # learnt facts are per address: a fresh one per deployment


def deployment(provider: str, api_base: str | None = None) -> Deployment:
    base = api_base or f"http://127.0.0.1:{next(PORTS)}/v1"
    return Deployment(
        alias="summ", model=f"{provider}/summ", provider=provider, upstream_model="summ",
        api_base=base, api_key="k",
    )  # fmt: skip


FACTS = DeploymentFacts()  # one app's, shared by its summary wires and upstreams


def wires() -> SummaryWires:
    natives = [wire.native for wire in WIRES if wire.native is not None]
    return summary_wires(Upstreams(ServerSettings, natives, FACTS))


def chosen(parent: str, target: Deployment) -> str:
    wire = wires().choose(parent, target)
    return "chat" if wire is None else wire.name


def test_the_request_s_own_wire_when_the_deployment_speaks_it() -> None:
    assert chosen("responses", deployment("openai")) == "responses"
    assert chosen("anthropic", deployment("anthropic")) == "anthropic"


def test_chat_on_the_fast_path_and_a_native_wire_off_it() -> None:
    assert chosen("chat", deployment("openai")) == "chat"
    assert chosen("anthropic", deployment("openai")) == "chat"
    assert chosen("responses", deployment("hosted_vllm")) == "chat"
    # An Anthropic model: natively, not litellm's translation, whoever asked.
    assert chosen("chat", deployment("anthropic")) == "anthropic"
    assert chosen("responses", deployment("anthropic")) == "anthropic"


def test_a_route_missing_404_teaches_that_a_deployment_serves_no_chat() -> None:
    summaries = wires()
    target = deployment("openai")
    assert not summaries.learn_no_chat(target, 404, MODEL_NOT_FOUND)  # OpenAI's own 404
    assert not summaries.learn_no_chat(target, 500, NOT_FOUND)
    assert chosen("chat", target) == "chat"
    assert summaries.learn_no_chat(target, 404, NOT_FOUND)
    assert chosen("chat", target) == "responses"
    assert chosen("chat", dataclasses.replace(target, model="openai/other")) == "chat"
    # Nothing is learnt where no other wire would speak to the deployment.
    assert not summaries.learn_no_chat(deployment("hosted_vllm"), 404, NOT_FOUND)


def test_a_deployment_learnt_to_serve_no_responses_gets_chat() -> None:
    target = deployment("openai")
    assert no_responses(FACTS).learn(target, 404, NOT_FOUND)
    assert chosen("responses", target) == "chat"


def test_a_responses_summary_has_room_for_reasoning_at_openai_s_own_api() -> None:
    official = deployment("openai", api_base="https://api.openai.com/v1")
    body = RESPONSES.request(official, "sys", "text", 500)
    assert body["max_output_tokens"] == 500 + REASONING_ALLOWANCE
    assert body["instructions"] == "sys" and body["store"] is False
    assert RESPONSES.request(deployment("openai"), "sys", "text", 500)["max_output_tokens"] == 500


def test_each_wire_reads_its_answer_s_text_and_nothing_else() -> None:
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}
    message = {"type": "message", "content": [{"type": "output_text", "text": "SUMMARY"}]}
    assert RESPONSES.text({"output": [reasoning, message]}) == "SUMMARY"
    assert RESPONSES.text({"output": [reasoning]}) is None
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "s"}
    assert ANTHROPIC.text({"content": [thinking, {"type": "text", "text": "SUMMARY"}]}) == "SUMMARY"
    assert ANTHROPIC.text({"content": [thinking]}) is None
    assert ANTHROPIC.headers == {"anthropic-version": "2023-06-01"}
    body = ANTHROPIC.request(deployment("anthropic"), "sys", "text", 300)
    assert (body["system"], body["max_tokens"]) == ("sys", 300)
