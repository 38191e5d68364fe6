"""The config loader: YAML files in; a frozen Config, or every problem with file, path and line."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped,unused-ignore]

from proxy.policies.loader import (
    SCHEMA_PATH,
    ConfigError,
    ConfigIssue,
    config_sources,
    load_config,
    sources_fingerprint,
    validate_paths,
)
from proxy.policies.spec import TracingSettings, key_digest

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """\
model_list:
  - model_name: strict-8k
    litellm_params:
      model: openai/strict-8k
      api_base: http://127.0.0.1:9911/v1
      api_key: os.environ/STRICT_KEY
    model_info:
      max_input_tokens: 8192
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def issues_of(path: Path) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == "\n".join(str(issue) for issue in caught.value.issues)
    return caught.value.issues


def only_issue(path: Path) -> ConfigIssue:
    issues = issues_of(path)
    assert len(issues) == 1, issues
    return issues[0]


def deployment_yaml(alias: str, model: str, extra: str = "") -> str:
    return f"  - model_name: {alias}\n    litellm_params:\n      model: {model}\n{extra}"


# --- a valid configuration -------------------------------------------------------------------


def test_minimal_config_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRICT_KEY", "sk-strict")
    path = write(tmp_path, "main.yaml", MINIMAL)

    config = load_config(path)

    (deployment,) = config.deployments["strict-8k"]
    assert deployment.alias == "strict-8k"
    assert deployment.model == "openai/strict-8k"
    assert deployment.provider == "openai"
    assert deployment.upstream_model == "strict-8k"
    assert deployment.api_base == "http://127.0.0.1:9911/v1"
    assert deployment.api_key == "sk-strict"
    assert deployment.max_input_tokens == 8192
    assert deployment.max_output_tokens is None
    assert deployment.timeout_s is None
    assert deployment.fast_path
    assert deployment.base_url == "http://127.0.0.1:9911/v1"
    assert deployment.litellm_params["api_key"] == "sk-strict"
    assert deployment.source == f"{path}: model_list[0]"
    assert config.sources == (str(path),)
    assert len(config.version) == 12
    int(config.version, 16)
    assert config.warnings == ()
    assert config.policies == ()
    assert config.server.port == 4000
    assert config.store.path == ".agentproxy"


def test_all_sections_build_typed_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "main.yaml",
        """\
        server: {host: 0.0.0.0, port: 8080, max_body_bytes: 2048, connect_timeout_s: 3,
                 read_timeout_s: 30, watch_interval_s: 2, access_log: false}
        store: {backend: local, path: /var/lib/agentproxy}
        keys:
          admin_key: admin-secret
          api_keys:
            - {name: agent, key: agent-secret, team: platform, models: [m]}
            - {name: other, key: other-secret}
        model_list:
          - model_name: m
            litellm_params:
              model: hosted_vllm/Qwen/Qwen3-8B
              api_base: http://gpu:8000/v1/
              timeout: 30
              stream_timeout: 90.5
              extra_headers: {X-Tenant: blue}
              max_retries: 0
            model_info: {max_output_tokens: 512, input_cost_per_token: 0,
                         output_cost_per_token: 2.0e-6, mode: chat}
        policies:
          - name: strict
            description: only agent on m
            mode: dry_run
            match: {models: [m], keys: [agent], headers: {X-Agent-Kind: coder}}
          - name: everyone
        """,
    )

    config = load_config(path)

    assert config.server.host == "0.0.0.0"
    assert config.server.port == 8080
    assert config.server.connect_timeout_s == 3.0
    assert isinstance(config.server.connect_timeout_s, float)
    assert config.server.access_log is False
    assert config.store.path == "/var/lib/agentproxy"
    (deployment,) = config.deployments["m"]
    assert (deployment.provider, deployment.upstream_model) == ("hosted_vllm", "Qwen/Qwen3-8B")
    assert deployment.base_url == "http://gpu:8000/v1"
    assert deployment.timeout_s == 30.0
    assert deployment.stream_timeout_s == 90.5
    assert deployment.extra_headers == {"X-Tenant": "blue"}
    assert deployment.litellm_params["max_retries"] == 0
    assert deployment.input_cost_per_token == 0.0
    assert deployment.output_cost_per_token == 2.0e-6
    assert config.keys.is_admin("admin-secret")
    assert not config.keys.is_admin("agent-secret")
    agent = config.keys.find("agent-secret")
    assert agent is not None
    assert agent.name == "agent"
    assert agent.team == "platform"
    assert agent.models == frozenset({"m"})
    assert agent.digest == key_digest("agent-secret")
    other = config.keys.find("other-secret")
    assert other is not None
    assert other.models is None
    strict, everyone = config.policies
    assert strict.mode == "dry_run"
    assert strict.description == "only agent on m"
    assert strict.match.models == frozenset({"m"})
    assert strict.match.keys == frozenset({"agent"})
    assert strict.match.headers == (("x-agent-kind", "coder"),)
    assert everyone.mode == "enforce"
    assert everyone.match.models is None
    assert config.select_policy("m", "agent", {"x-agent-kind": "coder"}) is strict
    assert config.select_policy("m", "other", {}) is everyone


def test_a_group_keeps_file_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "main.yaml",
        "model_list:\n"
        + deployment_yaml("fast", "openai/gpt-4o")
        + deployment_yaml("slow", "anthropic/claude-sonnet-4-5")
        + deployment_yaml("fast", "openrouter/openai/gpt-4o"),
    )

    config = load_config(path)

    assert [d.model for d in config.deployments["fast"]] == [
        "openai/gpt-4o",
        "openrouter/openai/gpt-4o",
    ]
    assert config.deployments["fast"][1].upstream_model == "openai/gpt-4o"
    assert config.deployments["fast"][1].source == f"{path}: model_list[2]"
    (slow,) = config.deployments["slow"]
    assert not slow.fast_path


def test_yaml_anchors_and_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "main.yaml",
        """\
        model_list:
          - model_name: a
            litellm_params: &local
              model: openai/a
              api_base: http://127.0.0.1:9911/v1
              timeout: 10
          - model_name: b
            litellm_params:
              <<: *local
              model: openai/b
              timeout: 20
        """,
    )

    config = load_config(path)

    assert config.deployments["b"][0].timeout_s == 20.0
    assert config.deployments["b"][0].base_url == "http://127.0.0.1:9911/v1"


def test_version_is_a_content_hash(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", MINIMAL)
    second = write(tmp_path, "b.yaml", MINIMAL)
    changed = write(tmp_path, "c.yaml", MINIMAL.replace("8192", "4096"))

    assert load_config(first).version == load_config(second).version
    assert load_config(first).version != load_config(changed).version


# --- several files ---------------------------------------------------------------------------


def test_directory_merges_in_name_order(tmp_path: Path) -> None:
    write(
        tmp_path,
        "10-base.yaml",
        """\
        server: {host: 0.0.0.0, port: 4001}
        keys:
          admin_key: first-admin
          api_keys: [{name: a, key: key-a}]
        model_list:
          - model_name: m
            litellm_params: {model: openai/one}
        policies:
          - name: first
        """,
    )
    write(
        tmp_path,
        "20-more.yml",
        """\
        server: {port: 4002}
        keys:
          admin_key: second-admin
          api_keys: [{name: b, key: key-b}]
        model_list:
          - model_name: m
            litellm_params: {model: openai/two}
          - model_name: n
            litellm_params: {model: openai/three}
        policies:
          - name: second
            match: {models: [n], keys: [a]}
        """,
    )
    write(tmp_path, "notes.txt", "not: [config")
    write(tmp_path, ".#10-base.yaml", "not: [config")
    (tmp_path / "nested").mkdir()
    write(tmp_path / "nested", "x.yaml", "not: [config")

    config = load_config(tmp_path)

    assert config.sources == (str(tmp_path / "10-base.yaml"), str(tmp_path / "20-more.yml"))
    assert config.server.host == "0.0.0.0"
    assert config.server.port == 4002
    assert config.keys.is_admin("second-admin")
    assert not config.keys.is_admin("first-admin")
    assert [k.name for k in config.keys.api_keys] == ["a", "b"]
    assert [d.upstream_model for d in config.deployments["m"]] == ["one", "two"]
    assert config.deployments["n"][0].source == f"{tmp_path / '20-more.yml'}: model_list[1]"
    assert [p.name for p in config.policies] == ["first", "second"]


def test_config_sources_lists_what_would_be_read(tmp_path: Path) -> None:
    for name in ("b.yml", "a.yaml", "c.json", ".hidden.yaml"):
        write(tmp_path, name, MINIMAL)

    assert config_sources(tmp_path) == [tmp_path / "a.yaml", tmp_path / "b.yml"]
    assert config_sources(tmp_path / "c.json") == [tmp_path / "c.json"]


def test_issues_use_the_index_within_their_own_file(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "model_list:\n" + deployment_yaml("a", "openai/a"))
    second = write(tmp_path, "b.yaml", "model_list:\n" + deployment_yaml("b", "openai/"))

    issue = only_issue(tmp_path)

    assert (issue.file, issue.path, issue.line) == (
        str(second),
        "model_list[0].litellm_params.model",
        4,
    )


def test_duplicate_names_across_files_point_at_both(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", "policies:\n  - name: p\n")
    second = write(tmp_path, "b.yaml", "policies:\n  - name: other\n  - name: p\n")

    issue = only_issue(tmp_path)

    assert str(issue) == (
        f"{second}:3: policies[1].name: duplicate policy name 'p'; "
        f"first defined at {first}: policies[0]"
    )


def test_errors_in_several_files_are_all_reported(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "server: {port: 0}\n")
    write(tmp_path, "b.yaml", "store: {backend: s3}\n")
    write(tmp_path, "c.yaml", "model_list: [\n")

    issues = issues_of(tmp_path)

    assert [(Path(i.file).name, i.path) for i in issues] == [
        ("a.yaml", "server.port"),
        ("b.yaml", "store.backend"),
        ("c.yaml", ""),
    ]


# --- each kind of error ----------------------------------------------------------------------


def test_a_bare_model_name_gets_its_provider_as_litellm_gives_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "main.yaml",
        """\
        model_list:
          - model_name: gpt4
            litellm_params: {model: gpt-4o, api_base: http://127.0.0.1:9911/v1}
          - model_name: claude
            litellm_params: {model: claude-sonnet-4-5, api_key: k}
          - model_name: local
            litellm_params: {model: my-model, api_base: http://127.0.0.1:9911/v1}
          - model_name: vllm
            litellm_params:
              model: meta-llama/Llama-3-8b
              custom_llm_provider: openai
              api_base: http://127.0.0.1:8000/v1
        """,
    )

    config = load_config(path)

    models = {
        alias: (d.provider, d.upstream_model, d.model) for alias, (d,) in config.deployments.items()
    }
    assert models == {
        "gpt4": ("openai", "gpt-4o", "openai/gpt-4o"),
        "claude": ("anthropic", "claude-sonnet-4-5", "anthropic/claude-sonnet-4-5"),
        "local": ("openai", "my-model", "openai/my-model"),
        "vllm": ("openai", "meta-llama/Llama-3-8b", "openai/meta-llama/Llama-3-8b"),
    }
    assert config.deployments["vllm"][0].fast_path
    assert f"{path}: model_list[0]: 'gpt-4o' is 'openai/gpt-4o' (litellm's model map)" in (
        config.notes
    )
    # A name the map does not know is a guess, and a guess is a warning.
    assert [w for w in config.warnings if "my-model" in w] == [
        f"{path}:7: model_list[2].litellm_params.model: 'my-model' has no provider prefix and "
        "litellm's model map does not know it: served as 'openai/my-model' (an "
        "OpenAI-compatible API); write 'provider/name' to pick another provider"
    ]


def test_unknown_keys_are_allowed_in_litellm_params_and_model_info(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "main.yaml",
        "model_list:\n"
        + deployment_yaml("m", "azure/gpt-4o", "      api_version: '2024-06-01'\n      rpm: 60\n")
        + "    model_info: {id: abc, mode: chat, base_model: azure/gpt-4o}\n",
    )

    (deployment,) = load_config(path).deployments["m"]

    assert deployment.litellm_params["api_version"] == "2024-06-01"
    assert deployment.litellm_params["rpm"] == 60


def test_many_errors_are_all_reported(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "main.yaml",
        """\
        server:
          port: -1
          colour: blue
        model_list:
          - model_name: m
            litellm_params: {model: openai/m, timeout: 0}
            model_info: {max_input_tokens: 0}
        policies:
          - mode: maybe
        """,
    )

    issues = issues_of(path)

    assert [(i.path, i.line) for i in issues] == [
        ("server.port", 2),
        ("server.colour", 3),
        ("model_list[0].litellm_params.timeout", 6),
        ("model_list[0].model_info.max_input_tokens", 7),
        ("policies[0]", 9),
        ("policies[0].mode", 9),
    ]


def test_many_semantic_errors_are_all_reported(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "main.yaml",
        """\
        model_list:
          - model_name: m
            litellm_params: {model: /gpt4, api_base: nowhere}
        policies:
          - {name: p, match: {models: [x], keys: [y]}}
          - {name: p}
        """,
    )

    issues = issues_of(path)

    assert sorted(i.path for i in issues) == [
        "model_list[0].litellm_params.api_base",
        "model_list[0].litellm_params.model",
        "policies[0].match.keys[0]",
        "policies[0].match.models[0]",
        "policies[1].name",
    ]


# --- files that cannot be read as a configuration --------------------------------------------


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "main.yaml",
        """\
        server:
          port: 4000
          host: [127.0.0.1
        store: {}
        """,
    )

    issue = only_issue(path)

    assert issue.file == str(path)
    assert issue.line == 4
    assert issue.message.startswith("invalid YAML: ")


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "main.yaml", "server:\n  port: 1\n  port: 2\n")

    issue = only_issue(path)

    assert (issue.path, issue.line, issue.message) == (
        "server.port",
        3,
        "duplicate key (first at line 2)",
    )


def test_non_string_key_is_an_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "main.yaml",
        "model_list:\n" + deployment_yaml("m", "openai/x", "      1: one\n"),
    )

    issue = only_issue(path)

    assert (issue.path, issue.line) == ("model_list[0].litellm_params", 5)
    assert "not a string" in issue.message


def test_missing_path(tmp_path: Path) -> None:
    issue = only_issue(tmp_path / "nope.yaml")

    assert str(issue) == f"{tmp_path / 'nope.yaml'}: no such file or directory"


def test_empty_directory(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "# not a config")

    assert "no *.yaml or *.yml files" in only_issue(tmp_path).message


@pytest.mark.parametrize("text", ["", "# all commented out\n", "---\n", "null\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "main.yaml", text)

    assert str(only_issue(path)) == f"{path}: file is empty"


@pytest.mark.parametrize("text", ["- model_name: m\n", "just text\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "main.yaml", text)

    issue = only_issue(path)

    assert issue.line == 1
    assert "top level must be a mapping" in issue.message


# --- environment variables and secrets -------------------------------------------------------


def test_unset_provider_key_is_only_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STRICT_KEY", raising=False)
    path = write(tmp_path, "main.yaml", MINIMAL)

    config = load_config(path)

    assert config.deployments["strict-8k"][0].api_key is None
    assert config.deployments["strict-8k"][0].litellm_params["api_key"] is None
    assert config.warnings == (
        f"{path}:6: model_list[0].litellm_params.api_key: environment variable 'STRICT_KEY' "
        "is not set; requests to this deployment will fail",
    )
    assert validate_paths([str(path)]) == ([], list(config.warnings))


def test_env_refs_resolve_throughout_litellm_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_BASE", "http://10.0.0.5:8000/v1")
    monkeypatch.setenv("TEST_TENANT", "blue")
    monkeypatch.setenv("TEST_ADMIN", "admin-from-env")
    monkeypatch.setenv("TEST_AGENT", "agent-from-env")
    path = write(
        tmp_path,
        "main.yaml",
        """\
        keys:
          admin_key: os.environ/TEST_ADMIN
          api_keys: [{name: agent, key: os.environ/TEST_AGENT}]
        model_list:
          - model_name: m
            litellm_params:
              model: custom_openai/m
              api_base: os.environ/TEST_BASE
              extra_headers: {X-Tenant: os.environ/TEST_TENANT}
        """,
    )

    config = load_config(path)

    (deployment,) = config.deployments["m"]
    assert deployment.api_base == "http://10.0.0.5:8000/v1"
    assert deployment.extra_headers == {"X-Tenant": "blue"}
    assert deployment.litellm_params["extra_headers"] == {"X-Tenant": "blue"}
    assert config.keys.is_admin("admin-from-env")
    assert config.keys.find("agent-from-env") is not None
    assert config.keys.find("os.environ/TEST_AGENT") is None


def test_header_from_an_unset_variable_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTPROXY_TEST_UNSET", raising=False)
    extra = (
        "      api_key: k\n      extra_headers: {X-A: a, X-B: os.environ/AGENTPROXY_TEST_UNSET}\n"
    )
    path = write(tmp_path, "main.yaml", "model_list:\n" + deployment_yaml("m", "openai/x", extra))

    config = load_config(path)

    assert config.deployments["m"][0].extra_headers == {"X-A": "a"}
    assert [w.split(": ")[1] for w in config.warnings] == [
        "model_list[0].litellm_params.extra_headers.X-B"
    ]


def test_secrets_never_appear_in_repr_or_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_ADMIN", "admin-secret-123")
    monkeypatch.setenv("TEST_PROVIDER", "sk-provider-secret")
    text = """\
        keys:
          admin_key: os.environ/TEST_ADMIN
          api_keys: [{name: a, key: client-secret-456}]
        model_list:
          - model_name: m
            litellm_params:
              model: openai/m
              api_key: os.environ/TEST_PROVIDER
              extra_headers: {Authorization: Bearer header-secret-789}
        """
    config = load_config(write(tmp_path, "main.yaml", text))
    secrets = ["admin-secret-123", "sk-provider-secret", "client-secret-456", "header-secret-789"]
    digests = [key_digest(s).hex() for s in secrets] + [repr(key_digest(s)) for s in secrets]

    shown = repr(config) + str(config)
    assert not [s for s in secrets + digests if s in shown]

    duplicated = text.replace("}]", "}, {name: b, key: client-secret-456}]")
    issues = issues_of(write(tmp_path, "dup.yaml", duplicated))
    assert "client-secret-456" not in "\n".join(map(str, issues))

    wrong_type = write(tmp_path, "wrong.yaml", "keys:\n  admin_key: 98765432\n")
    assert "98765432" not in str(only_issue(wrong_type))


# --- the schema file and the example ---------------------------------------------------------


def test_schema_symlink_resolves_to_the_packaged_schema() -> None:
    link = REPO / "schemas" / "config.schema.json"

    assert link.is_symlink()
    assert os.readlink(link) == "../proxy/policies/config.schema.json"
    assert link.resolve() == SCHEMA_PATH.resolve()


def test_schema_is_valid_and_every_property_is_described() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    Draft202012Validator.check_schema(schema)

    def undescribed(node: Any, path: str) -> list[str]:
        if isinstance(node, list):
            return [p for i, item in enumerate(node) for p in undescribed(item, f"{path}[{i}]")]
        if not isinstance(node, dict):
            return []
        missing = [
            f"{path}.{name}"
            for name, prop in node.get("properties", {}).items()
            if "description" not in prop
            and "description" not in schema["$defs"].get(prop.get("$ref", "").split("/")[-1], {})
        ]
        return missing + [
            p for key, value in node.items() for p in undescribed(value, f"{path}.{key}")
        ]

    assert undescribed(schema, "") == []


def test_example_config_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "AGENTPROXY_ADMIN_KEY",
        "AGENTPROXY_CODING_KEY",
        "AGENTPROXY_RESEARCH_KEY",
        "STRICT_KEY",
        "OPENAI_API_KEY",
        "OPENROUTER_API_KEY",
        "ANTHROPIC_API_KEY",
    ):
        monkeypatch.setenv(name, f"test-{name.lower()}")
    path = REPO / "examples" / "example.yaml"

    assert validate_paths([str(path)]) == ([], [])
    config = load_config(path)

    (strict,) = config.deployments["strict-8k"]
    assert strict.fast_path
    assert strict.base_url == "http://127.0.0.1:9911/v1"
    assert strict.max_input_tokens == 8192
    assert len(config.deployments["gpt-4o"]) == 2
    (claude,) = config.deployments["claude-sonnet"]
    assert claude.provider == "anthropic"
    assert not claude.fast_path
    assert config.keys.is_admin("test-agentproxy_admin_key")
    assert len(config.policies) == 2
    assert [p.name for p in config.policies] == ["research-experiment", "coding"]


def test_validate_paths_collects_errors_of_each_path(tmp_path: Path) -> None:
    good = write(tmp_path, "good.yaml", "server: {port: 4000}\n")
    bad = write(tmp_path, "bad.yaml", "server: {port: 0}\n")

    errors, warnings = validate_paths([str(good), str(bad), str(tmp_path / "missing")])

    assert [e.split(":")[0] for e in errors] == [str(bad), str(tmp_path / "missing")]
    assert warnings == []


# --- the watcher's fingerprint ---------------------------------------------------------------


def test_fingerprint_changes_on_edit_add_and_remove(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", MINIMAL)
    seen = [sources_fingerprint(tmp_path)]
    assert sources_fingerprint(tmp_path) == seen[0]

    first.write_text(MINIMAL + "policies: []\n")
    seen.append(sources_fingerprint(tmp_path))
    write(tmp_path, "b.yaml", "server: {port: 4001}\n")
    seen.append(sources_fingerprint(tmp_path))
    write(tmp_path, "ignored.txt", "anything")
    assert sources_fingerprint(tmp_path) == seen[-1]
    first.unlink()
    seen.append(sources_fingerprint(tmp_path))

    assert len(set(seen)) == len(seen)


def test_fingerprint_sees_a_same_size_replacement(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", "server: {port: 4001}\n")
    before = sources_fingerprint(path)
    stat = path.stat()
    replacement = write(tmp_path, "new.tmp", "server: {port: 4002}\n")
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    replacement.replace(path)  # how editors save: write aside, rename over

    assert sources_fingerprint(path) != before


def test_fingerprint_of_a_missing_path_does_not_raise(tmp_path: Path) -> None:
    assert sources_fingerprint(tmp_path / "missing") == ()


def test_policy_sections_load_into_typed_specs_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        MINIMAL
        + """
policies:
  - name: tight
    offload: {min_tokens: 500, preview_lines: 3}
    compaction:
      trigger: 0.5
      truncate_tools: [write_file]
      summarizer_model: strict-8k
    recall: {enabled: false}
  - name: plain
"""
    )
    tight, plain = load_config(path).policies
    assert tight.offload.min_tokens == 500 and tight.offload.line_chars == 1000
    assert tight.compaction.trigger == 0.5
    assert tight.compaction.truncate_tools == ("write_file",)
    assert tight.compaction.summarizer_model == "strict-8k"
    assert tight.recall.enabled is False and tight.repair.enabled is True
    assert plain.compaction.trigger == 0.85 and "edit_file" in plain.compaction.truncate_tools


def test_policy_section_errors_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        MINIMAL
        + """
policies:
  - name: bad
    compaction: {trigger: 1.5, summarizer_model: nope, surprise: 1}
"""
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert "policies[0].compaction.trigger" in text
    assert "policies[0].compaction" in text and "surprise" in text


def test_an_unknown_summarizer_model_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL + "policies:\n  - name: p\n    compaction: {summarizer_model: nope}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "policies[0].compaction.summarizer_model: unknown model alias 'nope'" in str(
        caught.value
    )


def test_resilience_sections_load(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        MINIMAL
        + """  - model_name: backup
    litellm_params: {model: openai/backup, api_base: "http://127.0.0.1:9912/v1"}
policies:
  - name: resilient
    retry: {attempts: 4, base_s: 0.1, classify: {transient: [409], logical: [503]}}
    fallbacks:
      - {from: strict-8k, to: [backup], when: [transient]}
    circuit: {failures: 2, cooldown_s: 5}
    loops: {window: 4, repeats: 2, ladder: [warn, block], allow: [poll_status]}
"""
    )
    (policy,) = load_config(path).policies
    assert policy.retry.attempts == 4 and policy.retry.cap_s == 8.0
    assert policy.retry.classify == {409: "transient", 503: "logical"}
    fallback = policy.fallback_for("strict-8k", "transient")
    assert fallback is not None and fallback.to == ("backup",) and fallback.when == ("transient",)
    assert policy.fallback_for("strict-8k", "overflow") is None
    assert policy.circuit.failures == 2
    assert policy.loops.ladder == ("warn", "block") and policy.loops.allow == ("poll_status",)


def test_routing_affinity_is_session_unless_said_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    policies = "policies:\n  - name: plain\n  - name: turns\n    routing: {affinity: none}\n"
    path.write_text(MINIMAL + policies)
    config = load_config(path)
    assert [p.routing.affinity for p in config.policies] == ["session", "none"]
    assert config.default_policy.routing.affinity == "session"
    path.write_text(MINIMAL + "policies:\n  - name: bad\n    routing: {affinity: sticky}\n")
    issue = only_issue(path)
    assert "policies[0].routing.affinity: 'sticky' is not one of ['session', 'none']" in str(issue)


def test_resilience_errors_name_the_path(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        MINIMAL
        + """policies:
  - name: bad
    fallbacks: [{from: strict-8k, to: [strict-8k, nope]}]
    loops: {window: 3, repeats: 5}
"""
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert "policies[0].fallbacks[0].to[1]: unknown model alias 'nope'" in text
    assert "cannot fall back to itself" in text
    assert "policies[0].loops.repeats: repeats (5) cannot exceed window (3)" in text


def test_budgets_load_and_wall_time_needs_a_lifetime_window(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        MINIMAL
        + """policies:
  - name: spend
    budgets:
      - {name: daily, scope: key, window: day, limits: {cost_usd: 5, tokens: 100000}}
      - {name: session, limits: {calls: 50, wall_s: 3600}, soft: 0.9, wrap_up: true}
"""
    )
    daily, session = load_config(path).policies[0].budgets
    assert daily.scope == "key" and daily.window == "day" and daily.limits["cost_usd"] == 5
    assert session.scope == "session" and session.wrap_up and session.soft == 0.9
    path.write_text(
        MINIMAL
        + """policies:
  - name: bad
    budgets: [{name: b, window: hour, limits: {wall_s: 10, bogus: 1}}]
"""
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "policies[0].budgets[0].limits" in str(caught.value)


def test_degraded_mode_is_a_policy_switch(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL + "policies:\n  - {name: soft, degraded: true}\n  - {name: hard}\n")
    soft, hard = load_config(path).policies
    assert soft.degraded is True and hard.degraded is False


def test_a_redis_url_from_the_environment_is_resolved_or_named_when_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "store:\n  backend: redis\n  url: os.environ/AGENTPROXY_TEST_REDIS\n"
    path = write(tmp_path, "main.yaml", text)
    monkeypatch.delenv("AGENTPROXY_TEST_REDIS", raising=False)
    issue = only_issue(path)
    assert (issue.path, issue.line) == ("store.url", 3)
    assert "environment variable 'AGENTPROXY_TEST_REDIS' is not set" in issue.message
    monkeypatch.setenv("AGENTPROXY_TEST_REDIS", "redis://:secret@127.0.0.1:6379/0")
    config = load_config(path)
    assert config.store.url == "redis://:secret@127.0.0.1:6379/0"


def test_errors_about_urls_hide_their_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BASE_FROM_ENV", "ftp://agent:hunter2@10.0.0.1/v1?token=tok-secret")
    text = (
        "store: {backend: redis, url: 'redis//:hunter2@10.0.0.2:6379/0'}\n"
        "model_list:\n"
        + deployment_yaml("a", "openai/a", "      api_base: os.environ/BASE_FROM_ENV\n")
        + deployment_yaml("b", "openai/b", "      api_base: 'htp://x:hunter2@h/v1?key=k-secret'\n")
    )
    (schema_issue,) = issues_of(write(tmp_path, "schema.yaml", text))
    assert schema_issue.path == "store.url"
    assert "'redis//***@10.0.0.2:6379/0' does not match" in schema_issue.message

    issues = issues_of(write(tmp_path, "meaning.yaml", text.replace("redis//", "redis://")))
    assert [issue.message for issue in issues] == [
        "'ftp://***@10.0.0.1/v1?token=***' is not an http(s) URL",
        "'htp://***@h/v1?key=***' is not an http(s) URL",
    ]
    errors, _ = validate_paths([str(tmp_path / "schema.yaml"), str(tmp_path / "meaning.yaml")])
    assert errors and not any(s in line for line in errors for s in ("hunter2", "secret"))


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("7d", 7 * 86400.0), ("12h", 43200.0), ("90m", 5400.0), ("3600s", 3600.0), ("1.5d", 129600.0),
     ("86400", 86400.0)],
)  # fmt: skip
def test_session_ttl_takes_a_unit(tmp_path: Path, given: str, seconds: float) -> None:
    path = write(tmp_path, "main.yaml", f"store: {{session_ttl: {given}}}\n")
    assert load_config(path).store.session_ttl_s == seconds


def test_retention_defaults(tmp_path: Path) -> None:
    store = load_config(write(tmp_path, "main.yaml", "store: {}\n")).store
    assert (store.session_ttl_s, store.max_mb, store.live_s) == (7 * 86400.0, 1024, 3600.0)
    no_cap = load_config(write(tmp_path, "main.yaml", "store: {max_mb: null}\n")).store
    assert no_cap.max_mb is None


def test_retention_errors_name_their_line(tmp_path: Path) -> None:
    issue = only_issue(write(tmp_path, "main.yaml", "store:\n  live_s: 60\n  session_ttl: 30s\n"))
    assert (issue.path, issue.line) == ("store.session_ttl", 3)
    assert "session_ttl (30s) is shorter than live_s (60s)" in issue.message
    issue = only_issue(write(tmp_path, "main.yaml", "store: {session_ttl: 7 days}\n"))
    assert issue.path == "store.session_ttl"
    issue = only_issue(write(tmp_path, "main.yaml", "store: {max_mb: 0}\n"))
    assert issue.path == "store.max_mb"


def test_the_old_ttl_s_still_works_with_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, "main.yaml", "store:\n  ttl_s: 7200\n")
    config = load_config(path)
    assert config.store.session_ttl_s == 7200.0
    assert any("main.yaml:2: store.ttl_s: ttl_s is now session_ttl" in w for w in config.warnings)


def test_prices_written_as_yaml_1_2_floats_load_as_numbers(tmp_path: Path) -> None:
    """`3e-6` is how a price is written; YAML 1.1 (PyYAML) would read it as a string."""
    path = write(
        tmp_path,
        "prices.yaml",
        """\
        model_list:
          - model_name: m
            litellm_params: {model: openai/m, api_base: "http://127.0.0.1:9/v1"}
            model_info:
              input_cost_per_token: 3e-6
              output_cost_per_token: 1.5E-5
              cache_read_input_token_cost: 3e-7
              cache_creation_input_token_cost: 3.75e-6
        """,
    )
    (deployment,) = load_config(path).deployments["m"]
    assert deployment.input_cost_per_token == 3e-6
    assert deployment.output_cost_per_token == 1.5e-5
    assert deployment.cache_read_cost_per_token == 3e-7
    assert deployment.cache_write_cost_per_token == 3.75e-6


def test_tracing_is_off_unless_enabled_and_read_from_its_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRICT_KEY", "k")
    assert load_config(write(tmp_path, "a.yaml", MINIMAL)).tracing == TracingSettings()
    tracing = "tracing: {enabled: true, endpoint: 'http://127.0.0.1:4318', sample_ratio: 1}\n"
    loaded = load_config(write(tmp_path, "a.yaml", MINIMAL + tracing)).tracing
    assert loaded == TracingSettings(True, "http://127.0.0.1:4318", None, 1.0)
    assert isinstance(loaded.sample_ratio, float)


@pytest.mark.parametrize(
    ("tracing", "said"),
    [
        ("{enabled: true, sample_ratio: 2}", "2 is greater than the maximum of 1"),
        ("{endpoint: '127.0.0.1:4318'}", "does not match"),
        ("{enable: true}", "enable"),
    ],
)
def test_a_bad_tracing_section_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tracing: str, said: str
) -> None:
    monkeypatch.setenv("STRICT_KEY", "k")
    issue = only_issue(write(tmp_path, "a.yaml", MINIMAL + f"tracing: {tracing}\n"))
    assert "tracing" in str(issue) and said in str(issue)


def test_model_info_names_what_a_model_takes(tmp_path: Path) -> None:
    info = (
        "    model_info: {supports_vision: false, supports_pdf_input: true,\n"
        "                 supports_function_calling: false, supports_reasoning: false}\n"
    )
    path = write(tmp_path, "c.yaml", "model_list:\n" + deployment_yaml("m", "openai/m", info))
    (deployment,) = load_config(path).deployments["m"]
    assert (deployment.supports_vision, deployment.supports_pdf_input) == (False, True)
    assert (deployment.supports_function_calling, deployment.supports_reasoning) == (False, False)
    path = write(tmp_path, "d.yaml", "model_list:\n" + deployment_yaml("m", "openai/m"))
    (unknown,) = load_config(path).deployments["m"]
    assert unknown.supports_vision is None and unknown.supports_reasoning is None
    bad = info.replace("supports_vision: false", "supports_vision: 'no'")
    path = write(tmp_path, "e.yaml", "model_list:\n" + deployment_yaml("m", "openai/m", bad))
    assert "supports_vision" in only_issue(path).path
