"""`serve --model`: one model, no file, any name."""

from __future__ import annotations

import pytest

from proxy.policies.loader import ConfigError
from proxy.policies.single_model import single_model_config


def test_one_model_under_its_own_name_and_any_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    config = single_model_config("openai/gpt-4o-mini")

    (deployment,) = config.deployments["gpt-4o-mini"]
    assert (deployment.provider, deployment.upstream_model) == ("openai", "gpt-4o-mini")
    assert deployment.base_url == "https://api.openai.com/v1" and deployment.api_key == "sk-env"
    assert config.catch_all == "gpt-4o-mini" and list(config.deployments) == ["gpt-4o-mini"]
    assert config.policies == () and config.default_policy.name == "default"
    assert config.sources == ("--model",)


def test_a_bare_name_and_an_api_base(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = single_model_config("gpt-4o", "http://127.0.0.1:9911/v1")

    (deployment,) = config.deployments["gpt-4o"]
    assert deployment.model == "openai/gpt-4o" and deployment.base_url == "http://127.0.0.1:9911/v1"
    assert deployment.api_key is None
    assert not [w for w in config.warnings if "not set" in w]  # a local API may need no key


def test_a_missing_key_for_the_provider_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    (warning,) = [w for w in single_model_config("openai/gpt-4o-mini").warnings if "not set" in w]
    assert warning == (
        "--model: model_list[0].litellm_params: no api_key, and OPENAI_API_KEY is not set; the "
        "provider will refuse calls"
    )


@pytest.mark.parametrize(
    ("model", "api_base", "message"),
    [
        ("openai/", None, "'openai/' names no model"),
        ("custom_openai/m", None, "provider 'custom_openai' has no default endpoint; set api_base"),
        ("openai/m", "localhost:8000", "'localhost:8000' is not an http(s) URL"),
    ],
)
def test_what_cannot_be_served_is_refused(model: str, api_base: str | None, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        single_model_config(model, api_base)
    assert message in str(caught.value) and str(caught.value).startswith("--model: ")
