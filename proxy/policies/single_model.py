"""The configuration of `agentproxy serve --model provider/name`: one model, no file.

The alias is the model's name without its provider ("openai/gpt-4o-mini" is served as
"gpt-4o-mini"), and any other model name a client sends is served by it too, as LiteLLM's
`litellm --model` does: a client configured for another model works unchanged. The provider
key comes from the environment (OPENAI_API_KEY, ...); the policies are the built-in default.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.policies.loader import load_document
from proxy.policies.spec import Config


def single_model_config(model: str, api_base: str | None = None) -> Config:
    """Raises ConfigError, naming `--model` or `--api-base`, when they cannot be served."""
    alias = model.partition("/")[2] or model
    params: dict[str, Any] = {"model": model}
    if api_base is not None:
        params["api_base"] = api_base
    config = load_document(
        "--model", {"model_list": [{"model_name": alias, "litellm_params": params}]}
    )
    return dataclasses.replace(config, catch_all=alias)
