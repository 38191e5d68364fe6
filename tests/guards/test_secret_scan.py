"""What counts as a secret, the policy's `guard.secrets` as loaded, and the stream restorer
giving back a placeholder split across two events."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from proxy.guards.secrets.patterns import SecretPatterns
from proxy.guards.secrets.placeholders import Minter
from proxy.guards.secrets.restore import StreamRestorer, restore_bytes
from proxy.policies.loader import ConfigError, load_config

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\nabc\n-----END RSA PRIVATE KEY-----"
KINDS = {
    "aws_access_key": "AKIAIOSFODNN7EXAMPLE",
    "github_token": "ghp_" + "a1B2" * 9,
    "api_key": "sk-ant-api03-" + "x" * 40,
    "private_key": PEM,
    "jwt": JWT,
}


@pytest.mark.parametrize("rule", list(KINDS))
def test_each_builtin_kind_is_found_whole(rule: str) -> None:
    secret = KINDS[rule]
    text = f"before {secret} after"
    found = list(SecretPatterns().find(text))
    assert [(f.rule, text[f.start : f.end]) for f in found] == [(rule, secret)]


def test_only_the_value_of_a_secret_looking_name_is_one() -> None:
    text = 'export GITHUB_TOKEN="tok-123456"\nSTRIPE_SECRET=abcd1234\nPATH=/usr/bin\nMONKEY_NAME=x'
    found = [text[f.start : f.end] for f in SecretPatterns().find(text)]
    assert found == ["tok-123456", "abcd1234"]


def test_ordinary_text_has_none_and_a_policy_pattern_adds_one() -> None:
    code = "def read(path):\n    return open(path).read()  # sk- is a prefix\n" * 200
    assert list(SecretPatterns().find(code)) == []
    custom = SecretPatterns(("acme-[0-9]{6}",))
    assert [f.rule for f in custom.find("id acme-123456 here")] == ["pattern_0"]


def test_placeholders_are_stable_per_owner_and_differ_between_owners() -> None:
    minter = Minter(b"k" * 32)
    one = minter.placeholder("key:a", "AKIAIOSFODNN7EXAMPLE")
    assert one == minter.placeholder("key:a", "AKIAIOSFODNN7EXAMPLE")
    assert one != minter.placeholder("key:b", "AKIAIOSFODNN7EXAMPLE")
    assert one.startswith("«secret:") and one.endswith("»") and "AKIA" not in one


def chunk(text: str) -> bytes:
    data = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + orjson.dumps(data) + b"\n\n"


def texts(stream: bytes) -> str:
    out = ""
    for event in stream.split(b"\n\n"):
        if event.startswith(b"data: {"):
            out += orjson.loads(event[6:])["choices"][0]["delta"]["content"]
    return out


@pytest.mark.parametrize("cut", range(1, 22))
def test_a_placeholder_split_across_events_is_given_back(cut: int) -> None:
    placeholder = "«secret:0123456789ab»"
    secrets = {placeholder: "AKIAIOSFODNN7EXAMPLE"}
    said = f"run aws with {placeholder} now"
    at = said.index(placeholder) + min(cut, len(placeholder) - 1)
    restorer = StreamRestorer(secrets)
    out = restorer.feed(chunk(said[:at])) + restorer.feed(chunk(said[at:]))
    out += restorer.feed(b"data: [DONE]\n\n") + restorer.end()
    assert texts(out) == "run aws with AKIAIOSFODNN7EXAMPLE now"
    assert out.endswith(b"data: [DONE]\n\n")


def test_a_guillemet_that_begins_no_placeholder_goes_out_as_it_came() -> None:
    restorer = StreamRestorer({"«secret:0123456789ab»": "x"})
    out = restorer.feed(chunk("quote «sec")) + restorer.feed(b"event: done\ndata: {}\n\n")
    out += restorer.end()
    assert texts(out) == "quote «sec" and out.endswith(b"event: done\ndata: {}\n\n")


def test_a_whole_body_gets_a_secret_back_json_escaped() -> None:
    secrets = {"«secret:0123456789ab»": 'pa"ss\nword'}
    body = orjson.dumps({"text": "use «secret:0123456789ab» and «secret:ffffffffffff»"})
    assert orjson.loads(restore_bytes(body, secrets)) == {
        "text": 'use pa"ss\nword and «secret:ffffffffffff»'
    }


def test_an_invalid_pattern_is_named_by_its_yaml_path(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "model_list:\n  - model_name: m\n    litellm_params: {model: openai/x}\n"
        "policies:\n  - name: p\n    guard: {secrets: {scrub: true, patterns: ['ok', '(']}}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "guard.secrets.patterns[1]" in str(caught.value)
    assert "not a regular expression" in str(caught.value)
    path.write_text(path.read_text().replace("scrub: true", "scrub: yes please"))
    with pytest.raises(ConfigError):
        load_config(path)


def test_signed_thinking_keeps_its_placeholders() -> None:
    """The provider verifies thinking against its signature when it comes back: a secret put
    into it would have the next turn refused."""
    secrets = {"«secret:0123456789ab»": "AKIAIOSFODNN7EXAMPLE"}
    thinking = {"type": "content_block_delta", "index": 0}
    thinking["delta"] = {"type": "thinking_delta", "thinking": "use «secret:0123456789ab»"}
    text = {"type": "content_block_delta", "index": 1}
    text["delta"] = {"type": "text_delta", "text": "use «secret:0123456789ab»"}
    events = b"".join(
        b"event: content_block_delta\ndata: " + orjson.dumps(e) + b"\n\n" for e in (thinking, text)
    )
    restorer = StreamRestorer(secrets)
    out = restorer.feed(events) + restorer.end()
    first, second = (orjson.loads(line[6:]) for line in out.split(b"\n") if line[:6] == b"data: ")
    assert first == thinking and second["delta"]["text"] == "use AKIAIOSFODNN7EXAMPLE"
    whole = orjson.dumps({"content": [thinking["delta"], text["delta"]]})
    assert orjson.loads(restore_bytes(whole, secrets))["content"] == [
        thinking["delta"],
        {"type": "text_delta", "text": "use AKIAIOSFODNN7EXAMPLE"},
    ]


def test_code_naming_secrets_holds_none() -> None:
    code = 'API_KEY = os.environ["API_KEY"]\nTOKEN=$(cat token.txt)\nSECRET = get_secret()\n'
    assert list(SecretPatterns().find(code)) == []


def test_a_password_with_shell_characters_is_one() -> None:
    text = "DB_PASSWORD=pa$$w0rd#1\n"
    assert [text[f.start : f.end] for f in SecretPatterns().find(text)] == ["pa$$w0rd#1"]
