"""The demo runs end to end and tells the story it promises."""

from __future__ import annotations

from proxy.demo import run_demo


async def test_demo_narrates_turns_errors_and_reload() -> None:
    lines: list[str] = []
    assert await run_demo(lines.append) == 0
    text = "\n".join(lines)
    assert text.count("proxy: request") == 5  # two tool rounds, one direct answer
    assert "assistant calls list_dir" in text and "assistant calls read_file" in text
    assert "HTTP 404 model_not_found" in text
    assert "HTTP 502 upstream_bad_response" in text
    assert "still serving" in text
    assert "/v1/models now: sim, sim-large" in text
