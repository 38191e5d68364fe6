"""The real Claude Code CLI through the proxy with a deny rule on Bash `rm -rf`: the simulated
model asks to delete the scratch repository; the CLI gets the refusal as text, never the call
(nothing deleted, no tool_result ever sent back), and ends its turn normally."""

from __future__ import annotations

from pathlib import Path

from proxy.sim import Simulator, run_simulator
from tests.conftest import ProxyFactory
from tests.support.sim_responders import ToolRoundTrip

from .conftest import SCRATCH_FILES, ClaudeCode
from .test_claude_code import bash_round_trip
from .test_claude_code_proxy import PROXY_KEY, UPSTREAM_KEY, events, proxy_for

DENY = """\
    policies:
      - name: agent
        guard:
          tool_calls:
            - name: no-rm-rf
              match: {tool: Bash, arguments: 'rm\\s+-rf'}
              action: deny
              reason: recursive deletes are not allowed here
    """


async def test_claude_code_gets_the_refusal_as_text_not_the_rm_rf_call(
    claude_code: ClaudeCode, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    wipe = {"command": "rm -rf ./*", "description": "Delete every file here"}
    responder = ToolRoundTrip(arguments=wipe)
    sim = Simulator(context_window=200_000, api_key=UPSTREAM_KEY, responder=responder)
    async with run_simulator(sim) as url:
        proxy = await proxy_for(start_proxy, tmp_path, url, window=200_000, policy=DENY)
        base = str(proxy.make_url("")).rstrip("/")
        run = await claude_code.run("clean this folder", base_url=base, api_key=PROXY_KEY)
    assert run.exit_code == 0, run.stderr
    assert "was refused" in run.stdout and "recursive deletes are not allowed" in run.stdout
    assert all(bash_round_trip(r) is None for r in sim.requests)  # the CLI never ran it
    assert all((claude_code.workdir / name).exists() for name in SCRATCH_FILES)
    denials = [e for e in events(proxy, tmp_path) if (e["stage"], e["action"]) == ("guard", "deny")]
    assert [(e["tool"], e["rule"]) for e in denials] == [("Bash", "no-rm-rf")]
