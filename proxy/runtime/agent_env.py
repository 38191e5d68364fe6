"""How `agentproxy run` points an agent at the proxy: the environment it starts with, and for
Codex a private CODEX_HOME.

Every command gets the base URLs the SDKs read (OPENAI_BASE_URL, OPENAI_API_BASE for older
ones, ANTHROPIC_BASE_URL, GOOGLE_GEMINI_BASE_URL), the run's session id (AGENTPROXY_SESSION;
Claude Code also sends it as the `x-agentproxy-session` header through ANTHROPIC_CUSTOM_HEADERS,
the Gemini CLI through GEMINI_CLI_CUSTOM_HEADERS) and a key for the proxy in place of the
user's provider keys.
Codex ignores OPENAI_BASE_URL: it gets a temporary CODEX_HOME whose config.toml is the user's,
with `model_provider` turned to a provider at the proxy, and whose other entries are links to
the user's own (auth, sessions, history, prompts stay where they were).
Qwen Code reads OPENAI_BASE_URL and OPENAI_API_KEY but needs an auth type, a model and its
settings' customHeaders: a temporary system settings file (QWEN_CODE_SYSTEM_SETTINGS_PATH, the
settings that override the user's and the project's) selects `openai` and adds the header,
OPENAI_MODEL names the proxy's first model. opencode reads none of these variables: its
OPENCODE_CONFIG_CONTENT (merged over every config file of the user's) adds a provider at the
proxy whose models are the proxy's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from proxy.sessions.identity import SESSION_HEADER

KEY_VARIABLE = "AGENTPROXY_API_KEY"  # the proxy key, when its keys.api_keys are set
PLACEHOLDER_KEY = "agentproxy-run"  # a proxy without keys takes any (SDKs insist on one)
CODEX_PROVIDER = "agentproxy"
PROVIDER = "agentproxy"  # opencode's provider at the proxy (Codex's is CODEX_PROVIDER)
KINDS = ("claude", "codex", "gemini", "qwen", "opencode")
QWEN_SETTINGS = "QWEN_CODE_SYSTEM_SETTINGS_PATH"
QWEN_DEFAULTS = "QWEN_CODE_SYSTEM_DEFAULTS_PATH"
QWEN_SYSTEM_SETTINGS = "/etc/qwen-code/settings.json"  # Qwen Code's default on Linux
OPENCODE_CONTENT = "OPENCODE_CONFIG_CONTENT"
# What to tell a user whose agent sent the proxy nothing, when its own reason is known. The
# Gemini CLI (0.61) with no auth type chosen takes GOOGLE_GEMINI_BASE_URL for a "gateway"
# sign-in that it refuses headless ("Invalid auth method selected."); a system settings file
# cannot choose one for it (it skips those in folders others may write, as all of /tmp).
NOTHING_SENT = {
    "gemini": "the Gemini CLI needs an auth type chosen once: `gemini-api-key` (the proxy key "
    'is its GEMINI_API_KEY), with /auth in the CLI or `"security": {"auth": {"selectedType": '
    '"gemini-api-key"}}` in ~/.gemini/settings.json',
}
# The user's provider credentials an agent would send to the proxy: never in its environment.
# (ANTHROPIC_API_KEY would also override the proxy key that ANTHROPIC_AUTH_TOKEN carries.)
PROVIDER_CREDENTIALS = frozenset(
    {
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
    }
)
_ROOT_PROVIDER = re.compile(r"^\s*model_provider\s*=")
_TABLE = re.compile(r"^\s*\[")
_OUR_TABLE = re.compile(rf"^\s*\[\s*model_providers\s*\.\s*\"?{CODEX_PROVIDER}\"?\s*[\].]")


def agent_kind(command: str) -> str:
    """One of KINDS, or "other": by the program's name, as the user typed it."""
    name = Path(command).name
    return name if name in KINDS else "other"


def agent_environment(
    environ: Mapping[str, str], proxy_url: str, session: str, key: str | None
) -> dict[str, str]:
    """The agent's environment: the user's, pointed at `proxy_url`, without the user's
    provider credentials (the proxy holds its own; an agent would only send them to it). The
    SDKs' key variables carry `key`, the proxy key given (--key, AGENTPROXY_API_KEY), else a
    placeholder (a proxy without keys takes any; an SDK refuses to start without one)."""
    env = {name: value for name, value in environ.items() if name not in PROVIDER_CREDENTIALS}
    env.update(
        OPENAI_BASE_URL=f"{proxy_url}/v1",
        OPENAI_API_BASE=f"{proxy_url}/v1",
        ANTHROPIC_BASE_URL=proxy_url,
        GOOGLE_GEMINI_BASE_URL=proxy_url,  # the Gemini CLI's (google-genai reads it too)
        AGENTPROXY_URL=proxy_url,
        AGENTPROXY_SESSION=session,
    )
    header = f"{SESSION_HEADER}: {session}"
    given = env.get("ANTHROPIC_CUSTOM_HEADERS", "").strip()
    env["ANTHROPIC_CUSTOM_HEADERS"] = f"{given}\n{header}" if given else header
    given = env.get("GEMINI_CLI_CUSTOM_HEADERS", "").strip()  # comma-separated, not lines
    env["GEMINI_CLI_CUSTOM_HEADERS"] = f"{given},{header}" if given else header
    # Claude Code takes a bearer token without asking whether to trust it (else it asks to log
    # in), and the proxy reads `Authorization` before `x-api-key`.
    env[KEY_VARIABLE] = env["OPENAI_API_KEY"] = env["ANTHROPIC_AUTH_TOKEN"] = key or PLACEHOLDER_KEY
    env["GEMINI_API_KEY"] = env[KEY_VARIABLE]  # sent as x-goog-api-key
    return env


def user_codex_home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("CODEX_HOME") or Path(environ.get("HOME", "~")) / ".codex").expanduser()


def codex_config(user_config: str, proxy_url: str, session: str) -> str:
    """The user's config.toml with `model_provider` turned to the proxy: the root key goes
    first (before any table, as TOML wants), the user's own root one out, the provider table
    last (a table of the user's of that name out). The proxy retries, so Codex does not retry
    requests on top of it."""
    kept, in_root, in_ours = [], True, False
    for line in user_config.splitlines():
        if _TABLE.match(line):
            in_root, in_ours = False, bool(_OUR_TABLE.match(line))
        if not (in_ours or (in_root and _ROOT_PROVIDER.match(line))):
            kept.append(line)
    provider = {
        "name": "AgentProxy",
        "base_url": f"{proxy_url}/v1",
        "env_key": KEY_VARIABLE,
        "wire_api": "responses",
        "request_max_retries": 0,
    }
    lines = [
        f"model_provider = {json.dumps(CODEX_PROVIDER)}",
        *kept,
        "",
        f"[model_providers.{CODEX_PROVIDER}]",
        *(f"{name} = {json.dumps(value)}" for name, value in provider.items()),
        f"http_headers = {{ {json.dumps(SESSION_HEADER)} = {json.dumps(session)} }}",
    ]
    return "\n".join(lines) + "\n"


def make_codex_home(
    environ: Mapping[str, str], proxy_url: str, session: str, warn: Callable[[str], None]
) -> Path:
    """A temporary CODEX_HOME (the caller removes it): config.toml made by codex_config, every
    other entry of the user's CODEX_HOME linked in. A user config.toml that does not merge
    into valid TOML (or was not) is left out, and `warn` says so."""
    user = user_codex_home(environ)
    home = Path(tempfile.mkdtemp(prefix="agentproxy-codex-"))
    try:
        config = user / "config.toml"
        text = config.read_text() if config.is_file() else ""
        merged = codex_config(text, proxy_url, session)
        try:
            tomllib.loads(merged)
        except tomllib.TOMLDecodeError as exc:
            warn(f"{config} left out of Codex's configuration for this run: {exc}")
            merged = codex_config("", proxy_url, session)
        (home / "config.toml").write_text(merged)
        if user.is_dir():
            for entry in user.iterdir():
                if entry.name != "config.toml":
                    (home / entry.name).symlink_to(entry)
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise
    return home


def _merged(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over` merged in, object by object (what `over` says wins)."""
    merged = dict(base)
    for name, value in over.items():
        below = merged.get(name)
        if isinstance(below, dict) and isinstance(value, Mapping):
            merged[name] = _merged(below, value)
        else:
            merged[name] = value
    return merged


def qwen_settings(user_system: Mapping[str, Any], session: str) -> dict[str, Any]:
    """Qwen Code's system settings for the run: the user's system settings (if any), with the
    `openai` auth type (which reads OPENAI_BASE_URL and OPENAI_API_KEY; a user's other choice
    would not reach the proxy; --auth-type still wins) and the session header added to any
    customHeaders of theirs."""
    ours = {
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"generationConfig": {"customHeaders": {SESSION_HEADER: session}}},
    }
    return _merged(dict(user_system), ours)


def make_qwen_settings(
    environ: Mapping[str, str], session: str, warn: Callable[[str], None]
) -> tuple[Path, dict[str, str]]:
    """A temporary folder (the caller removes it) holding Qwen Code's system settings for the
    run, and the variables that point Qwen Code at them. Its system defaults stay the user's
    (Qwen Code looks for them beside the system settings unless told). A user system settings
    file that is not JSON is left out, and `warn` says so."""
    given = environ.get(QWEN_SETTINGS) or QWEN_SYSTEM_SETTINGS
    defaults = environ.get(QWEN_DEFAULTS) or str(Path(given).parent / "system-defaults.json")
    user: dict[str, Any] = {}
    try:
        loaded = json.loads(Path(given).read_text())
        if not isinstance(loaded, dict):
            raise ValueError("not a JSON object")
        user = loaded
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        warn(f"{given} left out of Qwen Code's system settings for this run: {exc}")
    folder = Path(tempfile.mkdtemp(prefix="agentproxy-qwen-"))
    settings = folder / "settings.json"
    settings.write_text(json.dumps(qwen_settings(user, session), indent=2) + "\n")
    return folder, {QWEN_SETTINGS: str(settings), QWEN_DEFAULTS: defaults}


def qwen_model(environ: Mapping[str, str], models: Sequence[str]) -> dict[str, str]:
    """OPENAI_MODEL: the proxy's first model, unless the user names one (OPENAI_MODEL,
    QWEN_MODEL; their settings' model.name and -m win over it anyway)."""
    if environ.get("OPENAI_MODEL") or environ.get("QWEN_MODEL") or not models:
        return {}
    return {"OPENAI_MODEL": models[0]}


def opencode_config(
    proxy_url: str, session: str, key: str, models: Sequence[str]
) -> dict[str, Any]:
    """opencode's provider at the proxy (the OpenAI-compatible chat route), its models the
    proxy's, the first the default (-m agentproxy/NAME picks another)."""
    config: dict[str, Any] = {
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "AgentProxy",
                "options": {
                    "baseURL": f"{proxy_url}/v1",
                    "apiKey": key,  # in the environment already, as AGENTPROXY_API_KEY
                    "headers": {SESSION_HEADER: session},
                },
                "models": {name: {"name": name, "tool_call": True} for name in models},
            }
        }
    }
    if models:
        config["model"] = f"{PROVIDER}/{models[0]}"
    return config


def opencode_environment(
    environ: Mapping[str, str], proxy_url: str, session: str, key: str, models: Sequence[str],
    warn: Callable[[str], None],
) -> dict[str, str]:  # fmt: skip
    """OPENCODE_CONFIG_CONTENT: the user's own (if any) with opencode_config merged in. It is
    opencode's last config, over the user's global, OPENCODE_CONFIG and project ones, which
    stay as they are. A user's that is not JSON is left out, and `warn` says so."""
    user: dict[str, Any] = {}
    given = environ.get(OPENCODE_CONTENT, "").strip()
    if given:
        try:
            loaded = json.loads(given)
            if not isinstance(loaded, dict):
                raise ValueError("not a JSON object")
            user = loaded
        except ValueError as exc:
            warn(f"{OPENCODE_CONTENT} left out of opencode's configuration for this run: {exc}")
    merged = _merged(user, opencode_config(proxy_url, session, key, models))
    return {OPENCODE_CONTENT: json.dumps(merged)}


def command_path(command: str, environ: Mapping[str, str]) -> str | None:
    """Where the command is, on the agent's PATH; None when not found."""
    return shutil.which(command, path=environ.get("PATH", os.defpath))
