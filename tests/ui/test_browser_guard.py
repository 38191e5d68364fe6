"""The guard's decisions in the inspector, in a real headless Chromium (as tests/ui/
test_browser.py): a recorded session whose first call had a Bash `rm -rf` denied and whose
second, under a dry-run policy, only reports it; each event reads as its tag, what was
decided of which tool, by which rule and why, a denial marked apart and a dry run's
decision drawn as one."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Simulator
from proxy.state import RECORDINGS
from tests.conftest import ProxyFactory
from tests.guards.test_tool_rules import responder
from tests.ui.test_browser import ADMIN, ALICE, driver, keep  # noqa: F401 - the fixture

SESSION = "guard-me"
RULES = """\
      tool_calls:
        - name: no-rm-rf
          match: {tool: Bash, arguments: 'rm\\s+-rf'}
          action: deny
          reason: recursive deletes are not allowed here
"""


def config(sim_url: str, data: Path) -> str:
    head = textwrap.dedent(
        f"""\
        keys:
          admin_key: {ADMIN}
          api_keys: [{{name: alice, key: {ALICE}}}]
        store: {{path: {data}}}
        model_list:
          - model_name: sim
            litellm_params: {{model: openai/sim, api_base: "{sim_url}/v1"}}
        policies:
          - name: watching
            match: {{headers: {{x-guard-trial: "yes"}}}}
            record: {{enabled: true}}
            guard:
              mode: dry_run
        """
    )
    guarded = "  - name: guarded\n    record: {enabled: true}\n    guard:\n"
    return head + RULES + guarded + RULES


async def drive(proxy: TestServer) -> list[str]:
    """Two calls of alice's agent asking for `rm`: enforced, then (a header picks the dry-run
    policy) streamed under the dry run; the answers' texts."""
    headers = {"Authorization": f"Bearer {ALICE}", "x-agentproxy-session": SESSION}
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": {}}}]
    texts = []
    async with aiohttp.ClientSession() as http:
        for extra, stream in (({}, False), ({"x-guard-trial": "yes"}, True)):
            body = {"model": "sim", "messages": [{"role": "user", "content": "rm"}],
                    "tools": tools, "stream": stream}  # fmt: skip
            url = proxy.make_url("/v1/chat/completions")
            async with http.post(url, json=body, headers={**headers, **extra}) as response:
                assert response.status == 200, await response.text()
                texts.append(await response.text())
    await proxy.app[RECORDINGS].flush()
    return texts


def read(browser: Any, url: str, shot: Path) -> dict[str, Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 20)
    browser.get(f"{url}/ui")
    browser.execute_script(f"sessionStorage.setItem('agentproxy.inspector.key', '{ADMIN}')")
    browser.get(f"{url}/ui#session={SESSION}")
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".conversation")))
    events = browser.find_elements(
        By.XPATH, "//li[contains(@class, 'event')][span[@class='tag'][starts-with(., 'guard.')]]"
    )
    seen = {
        "events": [
            (
                e.find_element(By.CSS_SELECTOR, ".tag").text,
                e.get_attribute("class"),
                e.find_element(By.CSS_SELECTOR, ".fields").text,
            )
            for e in events
        ],
        "answers": [
            m.text
            for m in browser.find_elements(By.CSS_SELECTOR, "#turns > li.turn .message")
            if m.text.startswith("ANSWER")
        ],
        "console": browser.get_log("browser"),
    }
    keep(browser, shot)
    return seen


async def test_the_inspector_shows_a_denial_and_a_dry_runs_would_deny(
    driver: Any,  # noqa: F811 - the fixture imported above
    aiohttp_server: Any,
    start_proxy: ProxyFactory,
    tmp_path: Path,
) -> None:
    sim = Simulator(context_window=8192, responder=responder)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), tmp_path / "data"))
    proxy = await start_proxy(path)
    enforced, trial = await drive(proxy)
    assert "was refused" in enforced and "rm -rf" not in enforced
    assert '"name":"Bash"' in trial and "was refused" not in trial  # the dry run: unchanged
    url = str(proxy.make_url("")).rstrip("/")
    shot = tmp_path / "inspector-guard.png"
    seen = await asyncio.to_thread(read, driver, url, shot)

    why = "tool: Bash · rule: no-rm-rf · reason: recursive deletes are not allowed here"
    (deny, deny_class, deny_fields), (dry, dry_class, dry_fields) = seen["events"]
    assert (deny, deny_fields, dry, dry_fields) == ("guard.deny", why, "guard.would_deny", why)
    assert set(deny_class.split()) >= {"event", "guard", "error"}
    assert set(dry_class.split()) >= {"event", "guard", "dry"} and "error" not in dry_class
    assert "was refused" in seen["answers"][0] and "STOP: STOP" in seen["answers"][0]
    assert "Bash" in seen["answers"][1] and "was refused" not in seen["answers"][1]
    assert [e for e in seen["console"] if e["level"] in ("SEVERE", "WARNING")] == []
