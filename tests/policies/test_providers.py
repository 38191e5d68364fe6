"""Bare model names get the provider litellm gives them; provider keys come from the
environment under litellm's variable names."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from proxy.policies.loader import load_config
from proxy.policies.providers import _index, infer_provider, provider_key, split_model


@pytest.mark.parametrize(
    ("model", "custom", "expected"),
    [
        ("openai/gpt-4o", None, ("openai", "gpt-4o", None)),
        ("openrouter/openai/gpt-4o", None, ("openrouter", "openai/gpt-4o", None)),
        ("gpt-4o-mini", None, ("openai", "gpt-4o-mini", "litellm's model map")),
        ("claude-sonnet-4-5", None, ("anthropic", "claude-sonnet-4-5", "litellm's model map")),
        ("my-finetune", None, ("openai", "my-finetune", "guessed")),
        ("meta-llama/Llama-3-8b", "hosted_vllm", ("hosted_vllm", "meta-llama/Llama-3-8b", None)),
        ("openai/gpt-4o", "openai", ("openai", "gpt-4o", None)),
        ("openai/", None, ("", "", None)),
        ("/gpt-4o", None, ("", "", None)),
    ],
)
def test_split_model(model: str, custom: str | None, expected: tuple[str, str, str | None]) -> None:
    assert split_model(model, custom) == expected


def test_every_bare_name_litellm_resolves_gets_the_same_provider() -> None:
    """The drift check: asks litellm itself (in a child process: importing it costs seconds
    and ~190 MB) about every bare name in its map, and a few it finds by rule."""
    index = _index()
    by_rule = ["anthropic.claude-3-sonnet-20240229-v1:0", "claude-opus-9-1", "gpt-4o-2024-08-06"]
    names = [*sorted({*index.providers, *index.aliases}), *by_rule]
    ask = textwrap.dedent(
        """\
        import os, sys, orjson
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        import litellm
        litellm.suppress_debug_info = True
        answers = {}
        for name in orjson.loads(sys.stdin.buffer.read()):
            try:
                answers[name] = litellm.get_llm_provider(name)[1]
            except Exception:
                answers[name] = None  # litellm cannot say: our guess is ours to make
        sys.stdout.buffer.write(orjson.dumps(answers))
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", ask],
        input=orjson.dumps(names),
        capture_output=True,
        timeout=300,
        check=True,
    )
    litellm_says: dict[str, str | None] = orjson.loads(child.stdout)

    differ = {
        name: (infer_provider(name).provider, said)
        for name, said in litellm_says.items()
        if said is not None and infer_provider(name).provider != said
    }
    assert differ == {}
    assert sum(said is not None for said in litellm_says.values()) > 500


def test_provider_keys_come_from_litellm_variable_names() -> None:
    environ = {"OPENAI_API_KEY": "sk-o", "TOGETHER_AI_API_KEY": "t", "OR_API_KEY": "or"}
    assert provider_key("openai", environ) == ("OPENAI_API_KEY", "sk-o")
    assert provider_key("together_ai", environ) == ("TOGETHER_AI_API_KEY", "t")
    assert provider_key("openrouter", environ) == ("OR_API_KEY", "or")
    assert provider_key("anthropic", environ) is None
    assert provider_key("openai", {"OPENAI_API_KEY": ""}) is None  # empty is unset
    assert provider_key("bedrock", environ) is None  # litellm reads its own credentials


def test_a_deployment_without_api_key_reads_the_provider_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            model_list:
              - {model_name: gpt, litellm_params: {model: gpt-4o-mini}}
              - {model_name: written, litellm_params: {model: openai/x, api_key: mine}}
              - {model_name: claude, litellm_params: {model: anthropic/claude-sonnet-4-5}}
              - {model_name: local, litellm_params: {model: hosted_vllm/m, api_base: "http://127.0.0.1:1/v1"}}
              - {model_name: keyless, litellm_params: {model: openai/m, api_key: "", api_base: "http://127.0.0.1:1/v1"}}
            """
        )
    )
    config = load_config(path)

    assert config.deployments["gpt"][0].api_key == "sk-from-env"
    assert config.deployments["written"][0].api_key == "mine"
    assert config.deployments["claude"][0].api_key is None
    assert config.deployments["local"][0].api_key is None
    assert not config.deployments["keyless"][0].api_key  # an endpoint that must not see it
    assert f"{path}: model_list[0]: provider key from OPENAI_API_KEY" in config.notes
    # Only the provider's own endpoint is sure to refuse a call without a key.
    assert [w for w in config.warnings if "not set" in w] == [
        f"{path}:4: model_list[2].litellm_params: no api_key, and ANTHROPIC_API_KEY is not set; "
        "the provider will refuse calls"
    ]
