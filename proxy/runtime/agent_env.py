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
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path

from proxy.sessions.identity import SESSION_HEADER

KEY_VARIABLE = "AGENTPROXY_API_KEY"  # the proxy key, when its keys.api_keys are set
PLACEHOLDER_KEY = "agentproxy-run"  # a proxy without keys takes any (SDKs insist on one)
CODEX_PROVIDER = "agentproxy"
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
    """ "claude", "codex", "gemini" or "other": by the program's name, as the user typed it."""
    name = Path(command).name
    return name if name in ("claude", "codex", "gemini") else "other"


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


def command_path(command: str, environ: Mapping[str, str]) -> str | None:
    """Where the command is, on the agent's PATH; None when not found."""
    return shutil.which(command, path=environ.get("PATH", os.defpath))
