"""The real Codex CLI, configured with its built-in `openai` provider pointed at the proxy,
compacts through the proxy on a chat-only deployment.

Codex 0.171 compacts remotely whenever its provider is OpenAI's: not with POST
/responses/compact any more (its binary has no such endpoint) but with a create whose input
ends with `{"type": "compaction_trigger"}`, reading back exactly one `compaction` output item
("remote compaction v2"). A small `model_auto_compact_token_limit` makes it compact in the
middle of its first turn, after its first tool call; its next request then carries the item
the proxy minted, which the proxy reads back as the summary the chat upstream is sent."""

from __future__ import annotations

import textwrap
from pathlib import Path

import orjson

from proxy.sim import Simulator, run_simulator
from proxy.sim.model import JSON, text_of
from tests.conftest import ProxyFactory
from tests.support.scrape import metrics_of, sample
from tests.support.sim_responders import codex_shell_round_trip

from .conftest import CODEX_MODEL, Codex

PROXY_KEY = "sk-proxy-codex-compaction"
UPSTREAM_KEY = "sk-sim-upstream-codex-compaction"
SUMMARIZED = "[agentproxy] Earlier conversation summarized"
DONE = "Compacted; carrying on from the summary."


def after_summary(chat: JSON) -> JSON:
    """Codex's shell round trip, until the history starts from the proxy's summary: then
    a final answer (the tool's output now lives in the summary)."""
    if any(SUMMARIZED in text_of(m.get("content")) for m in chat.get("messages") or []):
        return {"role": "assistant", "content": DONE}
    reply: JSON = codex_shell_round_trip()(chat)
    return reply


async def test_codex_compacts_through_the_proxy_on_a_chat_only_model(
    codex: Codex, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=400_000, api_key=UPSTREAM_KEY, responder=after_summary)
    async with run_simulator(sim) as url:
        config = tmp_path / "agentproxy.yaml"
        config.write_text(
            textwrap.dedent(
                f"""\
                store: {{path: {tmp_path / "state"}}}
                keys:
                  api_keys: [{{name: codex, key: {PROXY_KEY}}}]
                model_list:
                  - model_name: {CODEX_MODEL}
                    litellm_params:
                      model: hosted_vllm/gpt-sim
                      api_base: {url}/v1
                      api_key: {UPSTREAM_KEY}
                    model_info: {{max_input_tokens: 400000}}
                """
            )
        )
        proxy = await start_proxy(config)
        base = str(proxy.make_url("/v1"))
        codex.config_toml = (
            f'model = "{CODEX_MODEL}"\n'
            f'openai_base_url = "{base}"\n'  # the built-in provider, pointed at the proxy
            "model_auto_compact_token_limit = 1000\n"
        )
        codex.extra_env["CODEX_API_KEY"] = PROXY_KEY  # what `codex exec` reads
        run = await codex.run("list the files here", base_url=base, api_key=PROXY_KEY)
    assert run.exit_code == 0, run.stderr
    assert DONE in run.stdout, run.stdout
    # Every upstream call was a chat completion: the proxy compacted, not the provider.
    assert {r.path for r in sim.requests} == {"/v1/chat/completions"}
    system = [text_of(r.body["messages"][0].get("content")) for r in sim.requests]
    assert sum("SESSION INTENT:" in text for text in system) == 1  # one summary written
    # Codex's request after the compaction: its history starts from the summary the proxy
    # minted the item for, and no longer holds the tool round the summary stands for.
    last = sim.requests[-1].body["messages"]
    sent = orjson.dumps(last).decode()
    assert SUMMARIZED in sent
    assert not any(m.get("role") == "tool" for m in last)
    edits = sample(
        await metrics_of(proxy),
        "agentproxy_context_edits_total",
        edit="compaction",
        source="client",
    )
    assert edits == 1
