"""A summary must have its four sections; the typography of the headings is free."""

from __future__ import annotations

import pytest

from proxy.pipeline.compaction.sections import SECTIONS, missing_sections


@pytest.mark.parametrize(
    "summary",
    [
        "SESSION INTENT:\ng\n\nSUMMARY:\ns\n\nARTIFACTS:\n- a\n\nNEXT STEPS:\nn",
        "## Session intent\ng\n**Summary:** s\n### Artifacts\n- none\n**NEXT STEPS**\n1. n",
        "SESSION INTENT: g\nSUMMARY: s\nARTIFACTS: none\nNEXT STEPS: n",
    ],
)
def test_four_headings_in_any_dress_pass(summary: str) -> None:
    assert missing_sections(summary) == []


def test_what_a_small_model_wrote_is_missing_everything() -> None:
    prose = "In summary, the user's goal was achieved. The task was completed successfully."
    assert missing_sections(prose) == list(SECTIONS)


def test_a_heading_must_start_its_line() -> None:
    text = "SUMMARY: the next steps are the artifacts of the session intent"
    assert missing_sections(text) == ["SESSION INTENT", "ARTIFACTS", "NEXT STEPS"]
