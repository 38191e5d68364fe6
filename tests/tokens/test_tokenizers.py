"""The tokenizers litellm ships, read from its package without importing it, offline (the
suite refuses any connection beyond loopback): the same counts litellm's own token counter
gives, one load per tokenizer however many ask at once, and the estimate when none applies."""

from __future__ import annotations

import asyncio
import threading

import pytest

from proxy.tokens.tokenizers import (
    Tokenizer,
    Tokenizers,
    bundle_folder,
    family,
    load,
    tokenizer_name,
)
from tests.tokens.litellm_reference import litellm

TEXTS = (
    "Keep the original bytes so a later turn sees the same prefix.",
    "\n".join(
        f"2026-11-30 10:{i:02d}:00 INFO request {i} served in {3 + i % 7} ms" for i in range(60)
    ),
    "def parse(self, text: str) -> list[Token]:\n    return [t for t in self._lex(text) if t]\n"
    * 20,
    "Ünïcödé, emoji 🚀 and 中文字符 mixed in.",
)


@pytest.mark.parametrize(
    "model, expected",
    [
        ("openai/gpt-4o", "o200k_base"),
        ("openai/gpt-5-codex", "o200k_base"),
        ("azure/gpt-4.1", "o200k_base"),
        ("openai/gpt-4", "cl100k_base"),
        ("anthropic/claude-sonnet-4-5-20250929", "anthropic"),
        ("anthropic/claude-3-5-sonnet-20241022", "cl100k_base"),
        ("deepseek/deepseek-chat", "deepseek"),
        ("openai/sim", "cl100k_base"),  # no known family: litellm's default, borrowed
        ("anthropic/claude-sim", "cl100k_base"),
        ("openai/text-davinci-003", "cl100k_base"),  # a legacy encoding litellm lacks
    ],
)
def test_the_tokenizer_follows_litellms_choice(model: str, expected: str) -> None:
    assert tokenizer_name(model) == expected


@pytest.mark.parametrize(
    "model, own",
    [
        ("openai/gpt-4o", True),
        ("deepseek/deepseek-chat", True),
        ("anthropic/claude-sonnet-4-5", False),  # the closest litellm has, not Claude's
        ("openai/sim", False),
    ],
)
def test_only_openai_and_deepseek_tokenizers_are_the_models_own(model: str, own: bool) -> None:
    assert family(model)[1] is own


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])
def test_tiktoken_counts_equal_tiktokens_own_encoding(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tiktoken pointed at litellm's bundled files (as litellm does; alone it would download
    them) gives the very counts the proxy's own reading of those files gives."""
    import tiktoken

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(bundle_folder()))

    name = tokenizer_name(f"openai/{model}")
    assert name is not None
    ours, theirs = load(name), tiktoken.get_encoding(name)
    for text in TEXTS:
        assert ours.count(text) == len(theirs.encode_ordinary(text)), text


@pytest.mark.parametrize("model", ["claude-sonnet-4-5-20250929", "deepseek-chat"])
def test_bundled_huggingface_counts_equal_litellms_token_counter(model: str) -> None:
    name = tokenizer_name(f"x/{model}")
    assert name is not None
    tokenizer = load(name)
    for text in TEXTS:
        assert tokenizer.count(text) == litellm().token_counter(model=model, text=text), text


class Counting:
    def __init__(self) -> None:
        self.loads = 0
        self.lock = threading.Lock()

    def __call__(self, name: str) -> Tokenizer:
        with self.lock:
            self.loads += 1
        return load(name)


async def test_a_tokenizer_loads_once_for_every_caller() -> None:
    loader = Counting()
    tokenizers = Tokenizers(loader)
    found = await asyncio.gather(*(tokenizers.get("openai/gpt-4o") for _ in range(5)))
    assert loader.loads == 1 and all(t is found[0] and t is not None for t in found)
    assert await tokenizers.get("openai/gpt-4o-mini") is found[0]  # the same encoding
    assert await tokenizers.get("openai/sim") is not None and loader.loads == 2  # cl100k


async def test_a_tokenizer_that_cannot_load_leaves_the_estimate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(name: str) -> Tokenizer:
        raise FileNotFoundError("no bundle")

    tokenizers = Tokenizers(broken)
    assert await tokenizers.get("openai/gpt-4o") is None
    assert await tokenizers.get("openai/gpt-4o") is None
    assert "unavailable" in caplog.text
