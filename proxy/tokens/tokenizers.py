"""Exact token counts from the tokenizers litellm ships, without importing litellm.

litellm's package folder holds tiktoken's encodings (cl100k_base and o200k_base, each under the
SHA-1 of its download URL, as tiktoken's cache names them) and HuggingFace tokenizer files
(`anthropic_tokenizer.json`, `deepseek_tokenizer.json`). They are read here directly: tiktoken
alone would download its encodings on first use (and fail offline), and `import litellm` costs
seconds. The model-to-tokenizer choice follows litellm's `token_counter`: DeepSeek models their
own, Claude models but Claude 3 the Anthropic one, otherwise tiktoken's encoding for the model
name, and cl100k_base for a model of no family litellm knows. Only OpenAI's and DeepSeek's are
the models' own; the others are the closest litellm has, and the calibration fits them.

Loading one takes 0.1-0.3 s and holds 30-85 MB: it happens in a thread the first time a model
needs exact counts (that request waits for it, once per process; other requests go on), and
it is kept for the process's life (shared by every app the process runs).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib.util
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

log = logging.getLogger("agentproxy.tokens")

BUNDLE = "litellm_core_utils/tokenizers"


class Tokenizer(Protocol):
    name: str

    def count(self, text: str) -> int: ...


# tiktoken's encodings, as tiktoken_ext.openai_public defines them (an encoding never changes):
# the download URL (whose SHA-1 names the bundled file), the file's SHA-256, the split pattern
# and the special tokens.
_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
ENCODINGS: dict[str, tuple[str, str, dict[str, int]]] = {
    "cl100k_base": (
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "|".join(
            [
                r"""'(?i:[sdmt]|ll|ve|re)""",
                r"""[^\r\n\p{L}\p{N}]?+\p{L}++""",
                r"""\p{N}{1,3}+""",
                r""" ?[^\s\p{L}\p{N}]++[\r\n]*+""",
                r"""\s++$""",
                r"""\s*[\r\n]""",
                r"""\s+(?!\S)""",
                r"""\s""",
            ]
        ),
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": (
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
}
HUGGINGFACE = {"anthropic": "anthropic_tokenizer.json", "deepseek": "deepseek_tokenizer.json"}
BORROWED = "cl100k_base"  # litellm's default for a model of no family it knows
_CLAUDE = re.compile(r"(?:^|[./])claude-(?:\d|instant|opus|sonnet|haiku)")
_DEEPSEEK = re.compile(
    r"deepseek[-_.](?:chat[-_.])?v[34]|(?:^|/)deepseek-(?:chat|reasoner|flash)(?::free)?$",
    re.IGNORECASE,
)


def tokenizer_name(model: str) -> str:
    """Which tokenizer litellm counts `model` ("provider/name") with."""
    return family(model)[0]


def family(model: str) -> tuple[str, bool]:
    """(the tokenizer litellm counts `model` with, whether it is the model's own). A model of
    no family litellm knows (a local model, a test double) is counted with cl100k_base, as
    litellm does: a byte-pair count follows what the text is made of (prose, code, log lines)
    far better than characters do, and the calibration fits it to the model's own."""
    name = model.partition("/")[2] or model
    if _DEEPSEEK.search(model):
        return "deepseek", True
    if _CLAUDE.search(name):  # Claude 3 and later: a tokenizer Anthropic has not published
        return ("cl100k_base" if "claude-3" in name else "anthropic"), "claude-2" in name
    import tiktoken.model  # a table, offline

    try:
        encoding = tiktoken.model.encoding_name_for_model(name)
    except KeyError:
        return BORROWED, False
    return (encoding, True) if encoding in ENCODINGS else (BORROWED, False)


def bundle_folder() -> Path | None:
    spec = importlib.util.find_spec("litellm")  # locates the package without importing it
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / BUNDLE


class _Tiktoken:
    def __init__(self, name: str, folder: Path) -> None:
        import tiktoken

        digest, pattern, special = ENCODINGS[name]
        path = folder / hashlib.sha1(_URL.format(name).encode()).hexdigest()
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"{path} is not {name} (hash mismatch)")
        ranks = {
            base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in data.splitlines() if line)
        }
        self.name = name
        self._encoding = tiktoken.Encoding(
            name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special
        )

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))


class _HuggingFace:
    def __init__(self, name: str, folder: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.name = name
        self._tokenizer = HFTokenizer.from_file(str(folder / HUGGINGFACE[name]))

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


_LOADED: dict[str, Tokenizer] = {}
_LOADING = threading.Lock()


def load(name: str) -> Tokenizer:
    """The tokenizer `name` from the bundled files (blocking: call it in a thread). Built once
    per process: it is immutable, and tens of megabytes."""
    with _LOADING:
        found = _LOADED.get(name)
        if found is None:
            folder = bundle_folder()
            if folder is None:
                raise FileNotFoundError("litellm is not installed: no bundled tokenizers")
            found = _HuggingFace(name, folder) if name in HUGGINGFACE else _Tiktoken(name, folder)
            _LOADED[name] = found
        return found


class Tokenizers:
    """The tokenizers loaded so far, by name; each loaded once, in a thread, on first need."""

    def __init__(self, loader: Callable[[str], Tokenizer] | None = load) -> None:
        """`loader=None`: no tokenizers at all, the estimate everywhere."""
        self._loader = loader
        self._ready: dict[str, Tokenizer | None] = {}  # None: could not be loaded
        self._loading: dict[str, asyncio.Task[Tokenizer | None]] = {}

    async def get(self, model: str) -> Tokenizer | None:
        """The model's tokenizer, loaded first if need be; None when it cannot be loaded (the
        estimate then stands)."""
        name = tokenizer_name(model)
        if name in self._ready:
            return self._ready[name]
        task = self._loading.get(name)
        if task is None:
            task = self._loading[name] = asyncio.get_running_loop().create_task(self._load(name))
        found = await asyncio.shield(task)
        self._ready[name] = found
        self._loading.pop(name, None)
        return found

    async def _load(self, name: str) -> Tokenizer | None:
        if self._loader is None:
            return None
        try:
            return await asyncio.to_thread(self._loader, name)
        except Exception as exc:
            log.warning("tokenizer %s unavailable (%s): token counts stay estimates", name, exc)
            return None

    async def close(self) -> None:
        for task in list(self._loading.values()):
            task.cancel()
