"""`agentproxy run --simulate`: the simulated models' configuration, kept across runs.

Its store, `run.log` and the configuration itself (simulate.yaml: JSON, which YAML reads) are
in the user's state folder ($XDG_STATE_HOME/agentproxy/simulate, else
~/.local/state/agentproxy/simulate), so a session replays after the proxy stopped: every
session is recorded. Any model name an agent asks for is served by the simulated model its
agent speaks natively (the catch-all); after the run the names the session asked for become
aliases in simulate.yaml of the model that served them, so `agentproxy replay --config` routes
the session's turns as the run did.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.policies.spec import Config

SIM_WINDOW = 200_000  # tokens: a coding agent's first turn (tools, instructions) fits
SIM_KEY = "agentproxy-sim"  # what the proxy sends the simulator (never a key of the user's)
SIM_CONFIG = "simulate.yaml"  # in the state folder: what `replay --config` reads
# The simulated model each agent speaks natively: it serves any name the agent asks for.
SIM_CATCH_ALL = {"claude": "claude", "gemini": "gemini"}


def simulate_config_path(environ: Mapping[str, str]) -> str:
    """--simulate's configuration, in its state folder (its store and log beside it)."""
    state = environ.get("XDG_STATE_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(os.path.abspath(state), "agentproxy", "simulate", SIM_CONFIG)


def simulated_config(sim_url: str, path: str, kind: str) -> Config:
    """The simulator's models: `sim` (OpenAI chat and Responses), `claude` (Anthropic
    Messages) and `gemini` (Gemini), every session recorded in the folder of `path`, where
    the document is written (or, kept, its aliases from earlier runs updated); any other
    name is served by the one its agent speaks natively: `claude` for Claude Code, `gemini`
    for the Gemini CLI, `sim` for the rest."""
    from proxy.policies.loader import load_document
    from proxy.store.files import private_dir

    def model(alias: str, name: str, base: str) -> dict[str, Any]:
        return {
            "model_name": alias,
            "litellm_params": {"model": name, "api_base": base, "api_key": SIM_KEY},
            "model_info": {"max_input_tokens": SIM_WINDOW},
        }

    state = private_dir(Path(path).parent)
    base = [
        model("sim", "openai/sim", f"{sim_url}/v1"),
        model("claude", "anthropic/claude-sim", sim_url),
        model("gemini", "gemini/gemini-sim", sim_url),
    ]
    # The aliases of earlier runs, at this run's simulator (by the simulated model they name).
    served = {entry["litellm_params"]["model"]: entry for entry in base}
    aliases = [
        {**served[model], "model_name": name}
        for name, model in _kept_aliases(path).items()
        if model in served
    ]
    document = {
        "store": {"path": str(state)},
        "model_list": base + aliases,
        "policies": [{"name": "simulate", "record": {"enabled": True}}],
    }
    config = load_document("--simulate", document)
    _write_json(path, document)
    return dataclasses.replace(config, catch_all=SIM_CATCH_ALL.get(kind, "sim"))


def _kept_aliases(path: str) -> dict[str, str]:
    """The aliases simulate.yaml holds, each with the simulated model it names."""
    try:
        with open(path, encoding="utf-8") as file:
            listed = json.load(file).get("model_list") or []
        return {
            str(entry["model_name"]): str(entry["litellm_params"]["model"])
            for entry in listed
            if entry["model_name"] not in ("sim", "claude", "gemini")
        }
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


async def alias_asked_models(path: str, session: str) -> None:
    """The model names the recorded session asked for, each an alias in simulate.yaml of the
    simulated model that served it: `replay --config` routes its turns as the run did."""
    from proxy.replay.session import SessionError, session_turns

    try:
        turns, _ = await session_turns(path, session, None)
    except SessionError:
        return
    _alias(path, turns)


def _alias(path: str, turns: list[dict[str, Any]]) -> None:
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except (OSError, ValueError):
        return
    models = document["model_list"]
    served = {entry["model_name"]: entry for entry in models[:3]}
    known = {entry["model_name"] for entry in models}
    for turn in turns:
        asked, alias = turn["request"].get("model"), turn.get("model")
        if isinstance(asked, str) and asked not in known and alias in served:
            models.append({**served[alias], "model_name": asked})
            known.add(asked)
    _write_json(path, document)


def _write_json(path: str, document: dict[str, Any]) -> None:
    """JSON (which YAML reads), written whole: a reader never sees half of it."""
    from proxy.store.files import private_file

    partial = f"{path}.{os.getpid()}.tmp"
    private_file(partial)
    with open(partial, "w", encoding="utf-8") as file:
        json.dump(document, file, indent=2)
    os.replace(partial, path)
