"""The structure every summary must have: four sections, each heading on its own line.

A summary without them is rejected (middle-out replaces the stretch instead): a small model
asked for a structured summary that answers "the user's goal was achieved" has lost the task,
and an agent reading that stops working. Headings are found leniently (any case, markdown
marks around them, the colon optional on a line of its own): the test is the structure, not
the typography.
"""

from __future__ import annotations

import re

SECTIONS = ("SESSION INTENT", "SUMMARY", "ARTIFACTS", "NEXT STEPS")
_HEADING = re.compile(
    r"^[ \t#*_>-]*(" + "|".join(SECTIONS) + r")[ \t*_]*(?::|[ \t*_]*$)",
    re.IGNORECASE | re.MULTILINE,
)


def missing_sections(summary: str) -> list[str]:
    """The required sections a summary lacks, in order (empty: it has them all)."""
    found = {match.group(1).upper() for match in _HEADING.finditer(summary)}
    return [section for section in SECTIONS if section not in found]


def section_span(summary: str, section: str) -> tuple[int, int] | None:
    """Where the body of `section` lies in `summary`: from after its heading to the next
    heading (or the end); None when it has no such heading."""
    headings = list(_HEADING.finditer(summary))
    for n, heading in enumerate(headings):
        if heading.group(1).upper() == section:
            end = headings[n + 1].start() if n + 1 < len(headings) else len(summary)
            return heading.end(), end
    return None
