"""OpenAI compaction through the proxy, for every deployment: POST /v1/responses/compact (the
provider's own on a native Responses deployment; the proxy's summarizer on a chat-only one),
the minted item read back as the history's new start on a later turn, forged or another key's
items refused, `context_management` compaction and Codex's `compaction_trigger`. Real sockets:
the openai SDK, the proxy, the simulator."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim import Simulator
from proxy.sim.model import SUMMARY_MAX_ARTIFACTS
from tests.conftest import ProxyFactory
from tests.support.scrape import metrics_of, sample

KEYS = {"alice": "sk-proxy-alice-0001", "bob": "sk-proxy-bob-00002"}
UPSTREAM_KEY = "sk-sim-upstream-secret"
HISTORY = [
    {"role": "user", "content": "Please refactor src/app.py to use pathlib."},
    {"role": "assistant", "content": "I read src/app.py; it builds paths with os.path.join."},
    {"role": "user", "content": "Also keep the CLI flags unchanged."},
    {"role": "assistant", "content": "Done: src/app.py now uses pathlib, flags untouched."},
]
OLD_WORDS = "os.path.join"  # only in the old history: gone once it is summarized


@pytest.fixture
async def upstream(aiohttp_server: Any) -> tuple[Simulator, TestServer]:
    sim = Simulator(context_window=100_000, api_key=UPSTREAM_KEY)
    return sim, await aiohttp_server(sim.app())


async def start(start_proxy: ProxyFactory, tmp_path: Path, sim_url: str) -> TestServer:
    config = tmp_path / "agentproxy.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            store: {{path: {tmp_path / "state"}}}
            keys:
              api_keys:
                - {{name: alice, key: {KEYS["alice"]}}}
                - {{name: bob, key: {KEYS["bob"]}}}
            model_list:
              - model_name: chat
                litellm_params:
                  model: hosted_vllm/sim
                  api_base: {sim_url}/v1
                  api_key: {UPSTREAM_KEY}
                model_info: {{max_input_tokens: 100000}}
              - model_name: native
                litellm_params:
                  model: openai/sim
                  api_base: {sim_url}/v1
                  api_key: {UPSTREAM_KEY}
                model_info: {{max_input_tokens: 100000}}
            """
        )
    )
    return await start_proxy(config)


def client(proxy: TestServer, who: str = "alice") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key=KEYS[who], max_retries=0)


def sent_text(body: dict[str, Any]) -> str:
    return orjson.dumps(body).decode()


async def test_compact_on_a_chat_only_deployment_is_the_proxys_and_reads_back(
    upstream: tuple[Simulator, TestServer], start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim, server = upstream
    proxy = await start(start_proxy, tmp_path, str(server.make_url("")).rstrip("/"))
    alice = client(proxy)
    compacted = await alice.responses.compact(model="chat", input=HISTORY)  # type: ignore[arg-type]
    assert compacted.object == "response.compaction"
    kinds = [item.type for item in compacted.output]
    assert kinds == ["message", "message", "compaction"]  # the user messages, then the item
    item = compacted.output[-1]
    assert item.encrypted_content.startswith("apc1.")  # type: ignore[union-attr]
    assert compacted.usage.input_tokens > 0  # the summary call's, charged to this request
    # No compact route reached the chat-only server: the summary went as a chat completion.
    assert [r.path for r in sim.requests] == ["/v1/chat/completions"]
    assert "SESSION INTENT:" in sent_text(sim.requests[0].body["messages"][0])

    # A later turn: the compacted window and a new message. The upstream sees the summary in
    # place of the item, not the old history.
    sim.requests.clear()
    window = [item.model_dump(exclude_none=True) for item in compacted.output]
    nxt = [*window, {"role": "user", "content": "Now add a test."}]
    for stream in (False, True):
        if stream:
            async with alice.responses.stream(model="chat", input=nxt) as events:
                answer = await events.get_final_response()
        else:
            answer = await alice.responses.create(model="chat", input=nxt)  # type: ignore[arg-type]
        assert answer.output_text
        sent = sim.requests[-1].body["messages"]
        text = sent_text(sent)
        assert "Earlier conversation summarized" in text and "SESSION INTENT:" in text
        assert OLD_WORDS not in text and "apc1." not in text
        assert sent[-1] == {"role": "user", "content": "Now add a test."}

    # Another key presenting alice's item, and an altered item: 400 naming the input index.
    bob = client(proxy, "bob")
    with pytest.raises(openai.BadRequestError) as refused:
        await bob.responses.create(model="chat", input=nxt)  # type: ignore[arg-type]
    assert refused.value.body["param"] == "input[2]"  # type: ignore[index]
    assert refused.value.body["code"] == "invalid_compaction_item"  # type: ignore[index]
    forged = dict(window[-1])
    content = forged["encrypted_content"]
    forged["encrypted_content"] = content[:-3] + ("AAA" if content[-3:] != "AAA" else "BBB")
    with pytest.raises(openai.BadRequestError) as altered:
        await alice.responses.create(
            model="chat",
            input=[window[0], forged, {"role": "user", "content": "go on"}],  # type: ignore[list-item]
        )
    assert altered.value.body["param"] == "input[1]"  # type: ignore[index]

    metrics = await metrics_of(proxy)
    edits = "agentproxy_context_edits_total"
    assert sample(metrics, edits, edit="compaction", source="client") == 1


async def test_compact_on_a_native_deployment_is_the_providers(
    upstream: tuple[Simulator, TestServer], start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim, server = upstream
    proxy = await start(start_proxy, tmp_path, str(server.make_url("")).rstrip("/"))
    compacted = await client(proxy).responses.compact(model="native", input=HISTORY)  # type: ignore[arg-type]
    assert [r.path for r in sim.requests] == ["/v1/responses/compact"]
    assert sim.requests[0].api_key == UPSTREAM_KEY
    assert sim.requests[0].body["input"] == HISTORY  # forwarded as sent
    item = compacted.output[-1]
    assert item.type == "compaction" and item.encrypted_content.startswith("gAAAAA")  # type: ignore[union-attr]
    # The provider's own item goes back to it as it is.
    sim.requests.clear()
    window = [i.model_dump(exclude_none=True) for i in compacted.output]
    await client(proxy).responses.create(
        model="native",
        input=[*window, {"role": "user", "content": "next"}],  # type: ignore[list-item]
    )
    assert window[-1] in sim.requests[-1].body["input"]


async def test_context_management_and_codexs_trigger_on_a_chat_only_deployment(
    upstream: tuple[Simulator, TestServer], start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim, server = upstream
    proxy = await start(start_proxy, tmp_path, str(server.make_url("")).rstrip("/"))
    alice = client(proxy)
    asked = [{"type": "compaction", "compact_threshold": 20}]
    for stream in (False, True):
        sim.requests.clear()
        if stream:
            async with alice.responses.stream(
                model="chat",
                input=HISTORY,
                context_management=asked,  # type: ignore[arg-type]
            ) as events:
                answer = await events.get_final_response()
        else:
            answer = await alice.responses.create(
                model="chat",
                input=HISTORY,
                context_management=asked,  # type: ignore[arg-type]
            )
        assert [i.type for i in answer.output] == ["compaction", "message"]
        assert answer.output_text
        # The model answered the compacted window: the summary, not the old turns.
        text = sent_text(sim.requests[-1].body["messages"])
        assert "Earlier conversation summarized" in text and OLD_WORDS not in text
    # Under the threshold nothing is compacted.
    roomy = [{"type": "compaction", "compact_threshold": 100_000}]
    plain = await alice.responses.create(model="chat", input=HISTORY, context_management=roomy)  # type: ignore[arg-type]
    assert [i.type for i in plain.output] == ["message"]

    # Codex's `compaction_trigger`: the answer is the compaction item alone.
    sim.requests.clear()
    trigger = await alice.responses.create(
        model="chat",
        input=[*HISTORY, {"type": "compaction_trigger"}],  # type: ignore[list-item]
    )
    assert [i.type for i in trigger.output] == ["compaction"]
    assert len(sim.requests) == 1  # the summary only: the model was not asked to go on


@pytest.mark.parametrize("mode", ["honour", "override"])
async def test_the_proxys_compaction_yields_to_a_responses_client_managing_its_context(
    upstream: tuple[Simulator, TestServer], start_proxy: ProxyFactory, tmp_path: Path, mode: str
) -> None:
    """A request with its own `context_management` compaction is the client's to cut: past the
    policy's trigger the proxy's compaction yields (compaction.yielded), unless it overrides."""
    sim, server = upstream
    proxy = await start(start_proxy, tmp_path, str(server.make_url("")).rstrip("/"))
    config = tmp_path / "agentproxy.yaml"
    text = config.read_text().replace("max_input_tokens: 100000", "max_input_tokens: 3000")
    policy = (
        "policies:\n  - name: tight\n    compaction: {trigger: 0.5, target: 0.3, "
        f"keep_messages: 2, prepare_at: null, client_managed: {mode}}}\n"
    )
    config.write_text(text + policy)
    proxy = await start_proxy(config)
    filler = "The build log said nothing new. " * 75  # ~600 tokens a turn
    turns = [
        message
        for n in range(4)
        for message in (
            {"role": "user", "content": f"Run the build again ({n})."},
            {"role": "assistant", "content": filler},
        )
    ]
    history = [*HISTORY, *turns]  # ~2,400 tokens: past half of 3,000
    quiet = [{"type": "compaction", "compact_threshold": 10_000_000}]  # never the client's turn
    raw = await client(proxy).responses.with_raw_response.create(
        model="chat", input=[*history, {"role": "user", "content": "next?"}],
        extra_body={"context_management": quiet},
    )  # fmt: skip
    applied = raw.headers.get("x-agentproxy-applied", "")
    if mode == "honour":
        assert "compaction.yielded" in applied
        assert OLD_WORDS in sent_text(sim.requests[-1].body)  # the client's history, whole
    else:
        assert "compaction.yielded" not in applied
        assert "compaction.summarized" in applied or "compaction.middle_out" in applied
    plain = await client(proxy).responses.with_raw_response.create(
        model="chat", input=[*history, {"role": "user", "content": "next?"}]
    )
    assert "compaction.yielded" not in plain.headers.get("x-agentproxy-applied", "")


async def test_a_compact_names_every_file_the_history_wrote(
    upstream: tuple[Simulator, TestServer], start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """The ledger of touched files (issue 38, item 5) reaches /v1/responses/compact too: the
    summary a later turn starts from names every file written, whatever the summarizer wrote
    (the simulated one names the first SUMMARY_MAX_ARTIFACTS paths it meets)."""
    sim, server = upstream
    proxy = await start(start_proxy, tmp_path, str(server.make_url("")).rstrip("/"))
    written = SUMMARY_MAX_ARTIFACTS + 12
    history: list[dict[str, Any]] = [{"role": "user", "content": "Write the modules."}]
    for i in range(written):
        arguments = orjson.dumps({"path": f"src/written_{i}.py", "content": "x = 1\n"}).decode()
        history += [
            {"type": "function_call", "call_id": f"c{i}", "name": "write_file",
             "arguments": arguments},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "written"},
        ]  # fmt: skip
    alice = client(proxy)
    compacted = await alice.responses.compact(model="chat", input=history)  # type: ignore[arg-type]
    window = [item.model_dump(exclude_none=True) for item in compacted.output]
    await alice.responses.create(
        model="chat", input=[*window, {"role": "user", "content": "Now add a test."}]
    )
    sent = sent_text(sim.requests[-1].body)
    assert all(f"src/written_{i}.py" in sent for i in range(written)), sent
