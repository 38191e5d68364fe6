"""The real Claude Code CLI, through the proxy with `guard.secrets.scrub`, against the strict
Anthropic twin: it reads a `.env` with Bash, the model (which only ever sees placeholders) has
it write one of the values into a file with its next command, and that command runs with the
real secret. No request the provider received holds a secret."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from proxy.sim import Simulator, run_simulator
from proxy.sim.model import JSON
from tests.conftest import ProxyFactory
from tests.support.sim_responders import ToolRoundTrip

from .conftest import ClaudeCode
from .test_claude_code_proxy import PROXY_KEY, UPSTREAM_KEY, proxy_for

AWS = "AKIAIOSFODNN7EXAMPLE"
TOKEN = "ghp_" + "Zq9x" * 9
ENV = f"AWS_ACCESS_KEY_ID={AWS}\nDEPLOY_TOKEN={TOKEN}\nREGION=eu-west-1\n"
PLACEHOLDER = re.compile(r"«secret:[0-9a-f]{12}»")


@dataclass
class UsesWhatItRead(ToolRoundTrip):
    """`cat .env`; then, with the value it was shown (a placeholder), `echo` it into a file;
    then say what it did. Judged from each request's own history, as the twin's responders."""

    def __call__(self, chat: JSON) -> JSON:
        if self.tool not in _offered(chat):
            return {"role": "assistant", "content": self.idle_answer}
        results = self.results(chat)
        if not results:
            return self.bash("cat .env")
        if len(results) == 1:
            line = next(x for x in results[0].splitlines() if x.startswith("AWS_ACCESS_KEY_ID="))
            value = line.split("=", 1)[1]
            return self.bash(f"echo 'key {value}' > used.txt && cat used.txt")
        return {"role": "assistant", "content": f"Wrote the key: {results[-1].strip()}"}

    def bash(self, command: str) -> JSON:
        arguments = {"command": command, "description": "run it"}
        call = {
            "type": "function",
            "function": {"name": self.tool, "arguments": orjson.dumps(arguments).decode()},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}


def _offered(chat: JSON) -> set[str]:
    return {(t.get("function") or {}).get("name") for t in chat.get("tools") or []}


async def test_claude_code_uses_a_secret_the_provider_never_saw(
    claude_code: ClaudeCode, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    (claude_code.workdir / ".env").write_text(ENV)
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY, responder=UsesWhatItRead())
    policy = "policies:\n  - name: guarded\n    guard: {secrets: {scrub: true}}\n"
    async with run_simulator(sim) as url:
        proxy = await proxy_for(start_proxy, tmp_path, url, window=200_000, policy=policy)
        base = str(proxy.make_url("")).rstrip("/")
        run = await claude_code.run("set up the deploy key", base_url=base, api_key=PROXY_KEY)
    assert run.exit_code == 0, run.stderr
    assert all(r.status == 200 for r in sim.requests), [r.status for r in sim.requests]
    # The command the model wrote with a placeholder ran with the secret.
    assert (claude_code.workdir / "used.txt").read_text() == f"key {AWS}\n"
    assert f"Wrote the key: key {AWS}" in run.stdout
    # The provider saw the file and the command's output, never a secret.
    sent = [orjson.dumps(r.body).decode() for r in sim.requests]
    assert not any(AWS in body or TOKEN in body for body in sent)
    last = sent[-1]
    assert "REGION=eu-west-1" in last and len(set(PLACEHOLDER.findall(last))) == 2
