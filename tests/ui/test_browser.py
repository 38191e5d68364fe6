"""The inspector in a real headless Chromium (Debian's chromium and chromium-driver, driven by
selenium): a recorded session with an offload, a summary and a call the upstream refused,
driven through the real proxy, found in the list, opened, its chart drawn, each call read as a
conversation (the messages new in it, the answer, a failed call's error text), the events new
in a call apart from those carried from earlier ones, the offloaded result read back in place,
and not one console error; a Gemini session's tool call and result read the same. Screenshots
are kept (the test's folder; also $AGENTPROXY_ARTIFACTS when set, as .ci/run sets it)."""

from __future__ import annotations

import asyncio
import os
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.sim.simulator import Fault, Simulator
from proxy.state import RECORDINGS
from tests.conftest import ProxyFactory, missing

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WINDOW = 4_000
ADMIN, ALICE = "admin-secret", "sk-alice-0001"
SESSION = "inspect-me"
EVIL = '<img src="/ui/x" onerror="document.title=1">'  # a session name is the client's text
REFUSED_ASK = {"role": "user", "content": "Port the parser now."}
LOG = "\n".join(
    "2026-11-30 10:06:17 ERROR database pool exhausted (code E-4417)"
    if i == 377
    else f"2026-11-30 10:{i // 60:02d}:{i % 60:02d} INFO request {i} served in {3 + i % 7} ms"
    for i in range(600)
)


def config(sim_url: str, data: Path, *, keys: bool = True, record: bool = True) -> str:
    keyed = f"""\
        keys:
          admin_key: {ADMIN}
          api_keys: [{{name: alice, key: {ALICE}}}]
        """
    return textwrap.dedent(
        f"""\
        {keyed.strip() if keys else ""}
        store: {{path: {data}}}
        model_list:
          - model_name: sim
            litellm_params: {{model: openai/sim, api_base: "{sim_url}/v1"}}
            model_info: {{max_input_tokens: {WINDOW}, input_cost_per_token: 0.000001,
                          output_cost_per_token: 0.000002}}
          - model_name: gemini-native
            litellm_params: {{model: gemini/gemini-sim, api_base: "{sim_url}"}}
            model_info: {{max_input_tokens: {WINDOW}}}
        policies:
          - name: inspected
            record: {{enabled: {str(record).lower()}}}
            offload: {{min_tokens: 500, preview_lines: 2}}
        """
    )


def call(i: int, path: str) -> dict[str, Any]:
    function = {"name": "read_file", "arguments": f'{{"path": "{path}"}}'}
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": function}]}  # fmt: skip


def histories() -> list[list[dict[str, Any]]]:
    """Three turns of one agent: a question, a huge log (offloaded), then enough module reads
    to pass the window's trigger (summarized)."""
    first = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Find why the server fails, then port the parser."},
    ]
    second = [*first, {"role": "assistant", "content": "Reading the log."}, call(0, "server.log"),
              {"role": "tool", "tool_call_id": "c0", "content": LOG}]  # fmt: skip
    third = [*second, {"role": "user", "content": "Now read the modules."}]
    for i in range(1, 13):
        third += [call(i, f"src/m{i}.py"),
                  {"role": "tool", "tool_call_id": f"c{i}",
                   "content": f"# module {i}\n" + "x = 1\n" * 230}]  # fmt: skip
    third.append({"role": "user", "content": "Go on with the next module."})
    return [first, second, third]


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Any]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        missing("headless Chromium for the inspector test", "Debian's chromium chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing("selenium for the inspector test", "the dev extra: pip install -e '.[dev]'")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,1150",
                     f"--user-data-dir={tmp_path / 'chromium'}"):  # fmt: skip
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    browser.set_page_load_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()


async def drive(proxy: TestServer, sim: Simulator) -> tuple[str, str]:
    """The three calls as alice's agent (two client turns: the second call only carries a
    tool's result), then a fourth the upstream refuses; the offloaded log's ref and the error
    text the agent got."""
    headers = {"Authorization": f"Bearer {ALICE}", "x-agentproxy-session": SESSION}
    applied = []
    url = proxy.make_url("/v1/chat/completions")
    async with aiohttp.ClientSession() as http:
        for messages in histories():
            body = {"model": "sim", "messages": messages}
            async with http.post(url, json=body, headers=headers) as response:
                assert response.status == 200, await response.text()
                applied.append(response.headers.get("x-agentproxy-applied", ""))
        sim.inject(Fault(status=400))
        refused = [*histories()[2], {"role": "assistant", "content": "Done."}, REFUSED_ASK]
        body = {"model": "sim", "messages": refused}
        async with http.post(url, json=body, headers=headers) as response:
            assert response.status == 400
            error = (await response.json())["error"]["message"]
        evil = {**headers, "x-agentproxy-session": EVIL}
        body = {"model": "sim", "messages": histories()[0]}
        async with http.post(proxy.make_url("/v1/chat/completions"), json=body, headers=evil) as r:
            assert r.status == 200
        archive = proxy.make_url(f"/v1/agentproxy/sessions/{SESSION}/archive")
        async with http.get(archive, headers=headers) as response:
            listed = (await response.json())["data"]
    assert "offload.offloaded" in applied[1], applied
    assert "compaction.summarized" in applied[2], applied
    await proxy.app[RECORDINGS].flush()
    return next(b["ref"] for b in listed if b["kind"] == "tool_result"), error


def keep(browser: Any, shot: Path) -> None:
    """A screenshot in the test's folder, and in $AGENTPROXY_ARTIFACTS when set."""
    browser.save_screenshot(str(shot))
    if folder := os.environ.get("AGENTPROXY_ARTIFACTS"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(folder) / shot.name)


def inspect(browser: Any, url: str, ref: str, shot: Path) -> dict[str, Any]:
    """What a person does in the page, in selenium's (blocking) calls."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 20)
    seen: dict[str, Any] = {}
    browser.get(f"{url}/ui")
    # The proxy has keys: the page asks for one before it asks the proxy for anything.
    wait.until(ready.text_to_be_present_in_element((By.ID, "status"), "Enter an admin key"))
    browser.find_element(By.ID, "key").send_keys(ADMIN)
    browser.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    link = wait.until(ready.element_to_be_clickable((By.LINK_TEXT, SESSION)))
    row = link.find_element(By.XPATH, "./ancestor::tr")
    seen["row"] = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
    keep(browser, shot.with_name("inspector-list.png"))
    seen["evil"] = [a.text for a in browser.find_elements(By.LINK_TEXT, EVIL)]
    seen["images"] = browser.find_elements(By.CSS_SELECTOR, "main img")
    link.click()
    received = wait.until(
        ready.presence_of_element_located((By.CSS_SELECTOR, "#chart path.line.received"))
    )
    seen["received_path"] = received.get_attribute("d")
    seen["sent_path"] = browser.find_element(
        By.CSS_SELECTOR, "#chart path.line.sent"
    ).get_attribute("d")
    seen["hash"] = browser.execute_script("return location.hash")
    offload = browser.find_element(By.XPATH, "//li[span[@class='tag']='offload.offloaded']")
    seen["offload_refs"] = [c.text for c in offload.find_elements(By.CSS_SELECTOR, "code.ref")]
    summary = browser.find_element(By.XPATH, "//li[span[@class='tag']='compaction.summarized']")
    seen["summary"] = summary.find_element(By.CSS_SELECTOR, "details.summary pre").text
    box = offload.find_element(By.XPATH, f".//div[@class='archived'][code='{ref}']")
    box.find_element(By.CSS_SELECTOR, "button.show-archived").click()
    wait.until(lambda _: "E-4417" in box.find_element(By.CSS_SELECTOR, "pre.stored").text)
    seen["stored"] = box.find_element(By.CSS_SELECTOR, "pre.stored").text
    seen["instead"] = box.find_element(By.CSS_SELECTOR, "pre.seen").text
    browser.execute_script("window.scrollTo(0, 0)")
    keep(browser, shot)
    # Each call as a conversation: its client turn, the messages new in it, the answer.
    calls = browser.find_elements(By.CSS_SELECTOR, "#turns > li.turn")
    seen["heads"] = [c.find_element(By.CSS_SELECTOR, ".turn-head").text for c in calls]
    seen["facts"] = browser.find_element(By.ID, "session-facts").text
    seen["first_in"] = [m.text for m in calls[0].find_elements(By.CSS_SELECTOR, ".message")]
    seen["second_in"] = [m.text for m in calls[1].find_elements(By.CSS_SELECTOR, ".message")]
    seen["tool_call_args"] = calls[1].find_element(By.CSS_SELECTOR, ".tool-call pre.args").text
    # Events: the offload is new on the second call, carried (folded apart) on the third.
    seen["second_new"] = [b.text for b in calls[1].find_elements(By.CSS_SELECTOR, ".event .badge")]
    carried = calls[2].find_element(By.CSS_SELECTOR, "details.carried")
    seen["carried_summary"] = carried.find_element(By.TAG_NAME, "summary").text
    seen["carried_hidden"] = not carried.find_element(By.CSS_SELECTOR, ".event").is_displayed()
    carried.find_element(By.TAG_NAME, "summary").click()
    seen["carried_tags"] = [t.text for t in carried.find_elements(By.CSS_SELECTOR, ".tag")]
    browser.execute_script("arguments[0].scrollIntoView()", calls[1])
    keep(browser, shot.with_name("inspector-conversation.png"))
    # The refused call: its status and the error text the agent got.
    failed = calls[3]
    seen["failed_class"] = failed.get_attribute("class")
    seen["error"] = failed.find_element(By.CSS_SELECTOR, ".turn-error").text
    seen["failed_in"] = [m.text for m in failed.find_elements(By.CSS_SELECTOR, ".message")]
    tags = failed.find_elements(By.CSS_SELECTOR, "details.carried .tag")
    seen["failed_carried"] = sorted(t.get_attribute("textContent") for t in tags)
    browser.execute_script("arguments[0].scrollIntoView()", failed)
    keep(browser, shot.with_name("inspector-failed.png"))
    # A link straight to the session by the name its client gave (what `agentproxy run`
    # prints) opens it, under its id: the key stays in the tab's sessionStorage.
    browser.get(f"{url}/ui#session={SESSION}")
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "#chart path.line.sent")))
    seen["direct_title"] = browser.find_element(By.ID, "session-title").text
    seen["direct_hash"] = browser.execute_script("return location.hash")
    seen["console"] = browser.get_log("browser")
    return seen


async def test_a_person_finds_the_session_and_reads_what_was_offloaded(
    driver: Any, aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    sim = Simulator(context_window=WINDOW)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), tmp_path / "data"))
    proxy = await start_proxy(path)
    ref, error = await drive(proxy, sim)
    shot = tmp_path / "inspector.png"
    url = str(proxy.make_url("")).rstrip("/")
    seen = await asyncio.to_thread(inspect, driver, url, ref, shot)

    assert seen["row"][1:4] == ["alice", "sim", "3 · 4 calls"]
    assert seen["evil"] == [EVIL] and seen["images"] == []  # shown as text, never as HTML
    for series in ("received_path", "sent_path"):  # four points each, drawn
        assert seen[series].startswith("M") and seen[series].count("L") == 3, seen[series]
    # Three client turns in four calls: the second call continues the first turn.
    assert "3 · 4 calls" in seen["facts"], seen["facts"]
    heads = [h.split("\n")[:2] for h in seen["heads"]]
    assert heads == [["Turn 1", "call 1"], ["Turn 1", "call 2 · continues"],
                     ["Turn 2", "call 3"], ["Turn 3", "call 4"]], heads  # fmt: skip
    # The first call's messages (the system prompt, the ask) and the model's answer.
    assert seen["first_in"][0].startswith("SYSTEM\nYou are a careful coding agent.")
    assert seen["first_in"][1] == "USER\n" + histories()[0][1]["content"]
    assert seen["first_in"][2].startswith("ANSWER · STOP: STOP\nYou said:"), seen["first_in"]
    # The second's: only what is new (the assistant's words and call, the tool's result).
    assert [m.split("\n")[0] for m in seen["second_in"]] == ["ASSISTANT", "ASSISTANT", "TOOL",
                                                            "ANSWER · STOP: STOP"]  # fmt: skip
    assert seen["tool_call_args"] == '{\n  "path": "server.log"\n}'  # pretty, not minified
    assert "new" in seen["second_new"]
    assert seen["carried_summary"].startswith("1 carried from earlier calls")
    assert seen["carried_hidden"] and seen["carried_tags"] == ["offload.offloaded"]
    assert "failed" in seen["failed_class"].split()
    # The summary's checkpoint, reused on the refused call, is carried too.
    assert seen["failed_carried"] == ["compaction.checkpoint_reused", "offload.offloaded"]
    assert seen["error"].startswith("HTTP 400 · the upstream said") and error in seen["error"]
    assert seen["failed_in"][-1] == "USER\n" + REFUSED_ASK["content"]
    assert seen["offload_refs"] and ref in seen["offload_refs"]
    assert "E-4417" in seen["stored"] and len(seen["stored"].splitlines()) == 600
    # Beside it, the pointer the model saw instead: the ref and the preview's first lines.
    assert ref in seen["instead"] and "INFO request 0 served" in seen["instead"]
    assert seen["summary"].strip()
    assert seen["direct_title"] == f"Session {SESSION}"
    assert seen["direct_hash"] == seen["hash"] != f"#session={SESSION}"
    assert [e for e in seen["console"] if e["level"] in ("SEVERE", "WARNING")] == []
    assert shot.stat().st_size > 10_000
    for name in ("inspector-conversation.png", "inspector-failed.png"):
        assert shot.with_name(name).stat().st_size > 10_000


def glance(browser: Any, url: str) -> dict[str, Any]:
    """An open proxy's inspector, on loopback: no key asked, the board's last turns."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 20)
    browser.get(f"{url}/ui")
    wait.until(ready.element_to_be_clickable((By.LINK_TEXT, SESSION))).click()
    button = wait.until(ready.element_to_be_clickable((By.CSS_SELECTOR, "button.show-archived")))
    button.click()
    stored = browser.find_element(By.CSS_SELECTOR, "pre.stored")
    wait.until(lambda _: "E-4417" in stored.text)
    return {
        "instead": browser.find_element(By.CSS_SELECTOR, "pre.seen").text,
        "timeline": browser.find_element(By.ID, "session-facts").text,
        "console": browser.get_log("browser"),
    }


async def test_an_open_proxy_shows_its_sessions_without_a_key(
    driver: Any, aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    upstream: TestServer = await aiohttp_server(Simulator(context_window=WINDOW).app())
    path = tmp_path / "agentproxy.yaml"
    url = str(upstream.make_url("")).rstrip("/")
    path.write_text(config(url, tmp_path / "data", keys=False, record=False))
    proxy = await start_proxy(path)
    async with aiohttp.ClientSession() as http:
        url = proxy.make_url("/v1/chat/completions")
        body = {"model": "sim", "messages": histories()[1]}
        async with http.post(url, json=body, headers={"x-agentproxy-session": SESSION}) as r:
            assert r.status == 200 and "offload.offloaded" in r.headers["x-agentproxy-applied"]
    seen = await asyncio.to_thread(glance, driver, str(proxy.make_url("")).rstrip("/"))
    assert "last turns in memory" in seen["timeline"]
    assert seen["instead"].startswith("not recorded")
    assert [e for e in seen["console"] if e["level"] in ("SEVERE", "WARNING")] == []


def page_through(browser: Any, url: str) -> dict[str, Any]:
    """The session's first page, then the next one from the "more" control."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 20)
    browser.get(f"{url}/ui")
    browser.execute_script(f"sessionStorage.setItem('agentproxy.inspector.key', '{ADMIN}')")
    browser.get(f"{url}/ui#session={SESSION}")
    more = wait.until(ready.element_to_be_clickable((By.ID, "more")))
    seen: dict[str, Any] = {"before": len(browser.find_elements(By.CSS_SELECTOR, "li.turn"))}
    seen["label"] = more.text
    more.click()
    wait.until(lambda _: len(browser.find_elements(By.CSS_SELECTOR, "li.turn")) > seen["before"])
    heads = browser.find_elements(By.CSS_SELECTOR, "li.turn .turn-head strong")
    seen["heads"] = [h.text.split("\n")[0] for h in heads]
    seen["path"] = browser.find_element(By.CSS_SELECTOR, "#chart path.line.sent").get_attribute("d")
    seen["more_shown"] = more.is_displayed()
    seen["console"] = browser.get_log("browser")
    return seen


async def test_a_long_timeline_is_read_a_page_at_a_time_from_the_more_control(
    driver: Any, aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path, monkeypatch: Any
) -> None:
    from proxy.routes import sessions as route

    monkeypatch.setattr(route, "DEFAULT_TURNS", 2)  # the four calls: two pages
    sim = Simulator(context_window=WINDOW)
    upstream: TestServer = await aiohttp_server(sim.app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), tmp_path / "data"))
    proxy = await start_proxy(path)
    await drive(proxy, sim)
    seen = await asyncio.to_thread(page_through, driver, str(proxy.make_url("")).rstrip("/"))
    assert seen["before"] == 2 and "after call 2" in seen["label"]
    assert seen["heads"] == ["Turn 1", "Turn 1", "Turn 2", "Turn 3"]
    assert seen["path"].count("L") == 3  # the chart drawn again over the four
    assert not seen["more_shown"]
    assert [e for e in seen["console"] if e["level"] in ("SEVERE", "WARNING")] == []


GEMINI_SESSION = "gemini-talk"


async def drive_gemini(proxy: TestServer) -> None:
    """A Gemini agent (the google-genai SDK): the model calls a tool, the agent answers it."""
    from google import genai
    from google.genai import types

    options = types.HttpOptions(
        base_url=str(proxy.make_url("")).rstrip("/"),
        headers={"x-agentproxy-session": GEMINI_SESSION},
    )
    sdk = genai.Client(api_key=ALICE, http_options=options)
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    tools = [types.Tool(function_declarations=[
        types.FunctionDeclaration(name="read_file", parameters_json_schema=schema)])]  # fmt: skip
    config = types.GenerateContentConfig(
        tools=tools,
        system_instruction="You read files.",
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    ask = types.Content(role="user", parts=[types.Part(text='read_file({"path": "notes.txt"})')])
    reply = await sdk.aio.models.generate_content(
        model="gemini-native", contents=[ask], config=config
    )
    turn = reply.candidates[0].content  # type: ignore[index]
    assert turn is not None
    call = next(p.function_call for p in turn.parts or () if p.function_call)
    answer = types.Part.from_function_response(name="read_file", response={"output": "42 lines"})
    if call.id:
        answer.function_response.id = call.id  # type: ignore[union-attr]
    history = [ask, turn, types.Content(role="user", parts=[answer])]
    final = await sdk.aio.models.generate_content(
        model="gemini-native", contents=history, config=config
    )
    assert final.text == "read_file returned: 42 lines"
    await proxy.app[RECORDINGS].flush()


def read_gemini(browser: Any, url: str, shot: Path) -> dict[str, Any]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 20)
    browser.get(f"{url}/ui")
    browser.execute_script(f"sessionStorage.setItem('agentproxy.inspector.key', '{ADMIN}')")
    browser.get(f"{url}/ui#session={GEMINI_SESSION}")
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, ".conversation")))
    calls = browser.find_elements(By.CSS_SELECTOR, "#turns > li.turn")
    seen: dict[str, Any] = {
        "heads": [c.find_element(By.CSS_SELECTOR, ".turn-head").text for c in calls],
        "messages": [[m.text for m in c.find_elements(By.CSS_SELECTOR, ".message")] for c in calls],
        "console": browser.get_log("browser"),
    }
    keep(browser, shot)
    return seen


async def test_a_gemini_sessions_tool_call_and_result_read_as_a_conversation(
    driver: Any, aiohttp_server: Any, start_proxy: ProxyFactory, tmp_path: Path
) -> None:
    upstream: TestServer = await aiohttp_server(Simulator(context_window=WINDOW).app())
    path = tmp_path / "agentproxy.yaml"
    path.write_text(config(str(upstream.make_url("")).rstrip("/"), tmp_path / "data"))
    proxy = await start_proxy(path)
    await drive_gemini(proxy)
    url = str(proxy.make_url("")).rstrip("/")
    shot = tmp_path / "inspector-gemini.png"
    seen = await asyncio.to_thread(read_gemini, driver, url, shot)

    assert [h.split("\n")[:2] for h in seen["heads"]] == [
        ["Turn 1", "call 1"], ["Turn 1", "call 2 · continues"]]  # fmt: skip
    first, second = seen["messages"]
    assert first[:2] == ["SYSTEM\nYou read files.", 'USER\nread_file({"path": "notes.txt"})']
    assert first[2].startswith("ANSWER · STOP: STOP\n→ read_file")
    assert '{\n  "path": "notes.txt"\n}' in first[2]  # the call's arguments, pretty
    assert second[0].startswith("ASSISTANT\n→ read_file")
    assert second[1].startswith("TOOL\n← result") and '"output": "42 lines"' in second[1]
    assert second[2] == "ANSWER · STOP: STOP\nread_file returned: 42 lines"
    assert [e for e in seen["console"] if e["level"] in ("SEVERE", "WARNING")] == []
    assert shot.stat().st_size > 10_000
