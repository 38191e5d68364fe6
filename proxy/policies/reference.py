"""The configuration reference tables, rendered from the schema so the docs cannot drift.

Each settings section's table in docs/configuration.md sits between two markers,

    <!-- generated from the schema: server -->
    ...
    <!-- end of generated table -->

and is the schema's `properties` of that section in file order: the key, its `default` (or
`x-doc-default` where the value alone would mislead) and its `description`. Deprecated keys are
left out. `python -m proxy.policies.reference docs/configuration.md` rewrites the tables (`make
docs`); `--check` only says whether they are current, as tests/policies/test_reference.py does.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from proxy.policies.loader import SCHEMA_PATH

SECTIONS = ("server", "store", "tracing")
_BLOCK = re.compile(
    r"(<!-- generated from the schema: (\w+) -->\n)(.*?)(<!-- end of generated table -->)",
    re.DOTALL,
)
_MIB = 1024 * 1024


def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    return data


def table(section: str, document: dict[str, Any] | None = None) -> str:
    """One section's keys as a Markdown table."""
    properties = (document or schema())["properties"][section]["properties"]
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, spec in properties.items():
        if spec.get("deprecated"):
            continue
        rows.append(f"| `{key}` | {_default(key, spec)} | {spec['description']} |")
    return "\n".join(rows) + "\n"


def _default(key: str, spec: dict[str, Any]) -> str:
    if "x-doc-default" in spec:
        return str(spec["x-doc-default"])
    if "default" not in spec or spec["default"] is None:
        return "\u2013"  # an en dash: "no default"
    value = spec["default"]
    shown = f"`{json.dumps(value) if isinstance(value, bool) else value}`"
    if ("_bytes" in key) and isinstance(value, int) and value >= _MIB and value % _MIB == 0:
        shown += f" ({value // _MIB} MiB)"
    return shown


def render(text: str, document: dict[str, Any] | None = None) -> str:
    """`text` with every generated table replaced by the schema's current one."""
    document = document or schema()

    def fill(match: re.Match[str]) -> str:
        return match.group(1) + table(match.group(2), document) + match.group(4)

    return _BLOCK.sub(fill, text)


def sections_in(text: str) -> list[str]:
    return [match.group(2) for match in _BLOCK.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proxy.policies.reference",
        description="Rewrite the configuration tables of a Markdown file from the schema.",
    )
    parser.add_argument("path", type=Path, help="the Markdown file, e.g. docs/configuration.md")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a table is out of date"
    )
    args = parser.parse_args(argv)
    text = args.path.read_text()
    current = render(text)
    if current == text:
        return 0
    if args.check:
        print(f"{args.path}: configuration tables differ from the schema (run `make docs`)")
        return 1
    args.path.write_text(current)
    print(f"{args.path}: tables rewritten from {SCHEMA_PATH.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
