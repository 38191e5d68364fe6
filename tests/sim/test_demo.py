"""The demo runs end to end and tells the story it promises."""

from __future__ import annotations

from proxy.sim.demo import run_demo


async def test_demo_narrates_turns_errors_and_reload() -> None:
    lines: list[str] = []
    assert await run_demo(lines.append) == 0
    text = "\n".join(lines)
    assert text.count("proxy: request") == 8  # three tool rounds, two direct answers
    assert "assistant calls list_dir" in text and "assistant calls read_file" in text
    assert "proxy applied: offload.offloaded;count=1" in text
    assert "E-4417" in text  # found again through the recall tool, inside the proxy
    assert "assistant calls agentproxy_recall" not in text  # the client never sees that call
    assert "repair.patched_dangling;count=1" in text
    assert "HTTP 404 model_not_found" in text
    assert "HTTP 502 upstream_bad_response" in text
    assert "still serving" in text
    assert "/v1/models now: sim, sim-large" in text
