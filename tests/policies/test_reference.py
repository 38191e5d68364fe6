"""The configuration tables in docs/configuration.md are the schema's, and so are their defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from proxy.policies import reference
from proxy.policies.loader import load_config

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"
MODEL = """\
model_list:
  - model_name: m
    litellm_params: {model: openai/m, api_base: "http://127.0.0.1:9/v1", api_key: k}
"""


def test_the_docs_tables_are_the_schemas() -> None:
    text = DOC.read_text()
    assert reference.sections_in(text) == list(reference.SECTIONS)
    assert reference.render(text) == text, "run `make docs` after editing the schema"
    assert reference.main([str(DOC), "--check"]) == 0


def test_every_documented_key_has_a_meaning_and_deprecated_keys_are_left_out() -> None:
    document = reference.schema()
    store = reference.table("store", document)
    assert "| `session_ttl` |" in store and "| `ttl_s` |" not in store
    for section in reference.SECTIONS:
        for key, spec in document["properties"][section]["properties"].items():
            assert spec["description"].strip(), f"{section}.{key} has no description"


@pytest.mark.parametrize("section", reference.SECTIONS)
def test_the_documented_defaults_are_what_the_proxy_runs_with(section: str, tmp_path: Path) -> None:
    properties = reference.schema()["properties"][section]["properties"]
    stated = {key: spec["default"] for key, spec in properties.items() if "default" in spec}
    assert stated, section
    plain = tmp_path / "plain.yaml"
    plain.write_text(MODEL)
    explicit = tmp_path / "explicit.yaml"
    explicit.write_text(MODEL + yaml.safe_dump({section: stated}))

    assert getattr(load_config(explicit), section) == getattr(load_config(plain), section)


def test_check_reports_a_stale_table_and_a_rewrite_mends_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(DOC.read_text().replace("| `port` | `4000` |", "| `port` | `8080` |"))

    assert reference.main([str(stale), "--check"]) == 1
    assert "make docs" in capsys.readouterr().out
    assert reference.main([str(stale)]) == 0
    assert stale.read_text() == DOC.read_text()
