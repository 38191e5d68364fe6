"""`guard.tool_calls` and `guard.mode` as the loader reads them: a tool named exactly or, written
/…/, by a regular expression over the whole name; arguments by a regular expression searched
in their text; every mistake named by its YAML path (a bad pattern, an unknown key, an
action that is not one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.policies.loader import ConfigError, load_config
from tests.policies.test_loader import MINIMAL


def loaded(tmp_path: Path, guard: str) -> object:
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL + "policies:\n  - name: p\n    guard:\n" + guard)
    return load_config(path).policies[0].guard


def error(tmp_path: Path, guard: str) -> str:
    with pytest.raises(ConfigError) as caught:
        loaded(tmp_path, guard)
    return str(caught.value)


def test_a_tool_is_a_name_or_a_slashed_regex_over_the_whole_name(tmp_path: Path) -> None:
    guard = loaded(
        tmp_path,
        """\
      mode: dry_run
      tool_calls:
        - {match: {tool: Bash}, action: deny}
        - {match: {tool: /Read|Grep/, arguments: 'secret'}, action: warn, name: reads}
        - {match: {arguments: 'git\\s+push\\s+--force'}, action: deny, reason: no force-push}
""",
    )
    exact, pattern, anything = guard.tool_calls  # type: ignore[attr-defined]
    assert guard.mode == "dry_run"  # type: ignore[attr-defined]
    assert exact.watches("Bash") and not exact.watches("BashOutput")
    assert pattern.watches("Read") and pattern.watches("Grep") and not pattern.watches("ReadX")
    assert anything.watches("whatever")  # no tool: any call may match, by its arguments
    assert (exact.label, pattern.label, anything.label) == ("0", "reads", "2")
    assert pattern.arguments.search('{"path": "secret.txt"}')
    assert anything.reason == "no force-push"


def test_a_bad_pattern_is_named_by_its_path(tmp_path: Path) -> None:
    text = error(
        tmp_path, "      tool_calls:\n        - {match: {arguments: 'rm (-rf'}, action: deny}\n"
    )
    assert "policies[0].guard.tool_calls[0].match.arguments: not a regular expression" in text
    text = error(tmp_path, "      tool_calls:\n        - {match: {tool: '/Ba[/'}, action: deny}\n")
    assert "policies[0].guard.tool_calls[0].match.tool: not a regular expression" in text


@pytest.mark.parametrize(
    ("rule", "where"),
    [
        ("{match: {tool: Bash}, action: block}", "tool_calls[0].action"),
        ("{match: {tool: Bash}}", "tool_calls[0]"),
        ("{match: {}, action: deny}", "tool_calls[0].match"),
        ("{match: {tool: Bash, args: x}, action: deny}", "tool_calls[0].match"),
        ("{match: {tool: Bash}, action: deny, name: 'has space'}", "tool_calls[0].name"),
    ],
)
def test_a_malformed_rule_is_named_by_its_path(tmp_path: Path, rule: str, where: str) -> None:
    text = error(tmp_path, f"      tool_calls:\n        - {rule}\n")
    assert f"policies[0].guard.{where}" in text, text


def test_an_unknown_mode_is_named(tmp_path: Path) -> None:
    assert "policies[0].guard.mode" in error(tmp_path, "      mode: audit\n")
