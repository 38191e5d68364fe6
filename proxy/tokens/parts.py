"""Tokens of the parts of a message that are not text: images, documents, audio.

The providers' published rules, as litellm's token counter applies them (without importing
litellm), chosen by the part's own shape — an Anthropic `image` block is counted as Claude
counts it, a chat `image_url` or Responses `input_image` part as OpenAI does:

- OpenAI images: `detail: low` is 85 tokens; otherwise the image is scaled to fit 2048 x 2048,
  then its short side to 768, and each 512-pixel tile costs 170 more (GPT-4o's figures).
- Claude images: the image scaled to fit 1568 pixels on its long edge costs one token per
  28 x 28 patch, at most 1568 tokens.
- An image whose size cannot be read (a URL, an unknown format) counts as the largest: the
  proxy estimates high, as a guard should.
- Documents (PDF): 2,000 tokens a page (Anthropic: 1,500-3,000, text plus the page's image); a
  text document by its text. Audio: 10 tokens a second (WAV from its header, else 16 kB/s).

The exact figure differs by model; the per-session calibration absorbs what remains.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
from typing import Any

OPENAI_BASE, OPENAI_TILE = 85, 170
OPENAI_UNKNOWN = OPENAI_BASE + 4 * OPENAI_TILE  # a 1024 x 1024 image: 2 x 2 tiles
CLAUDE_MAX_EDGE, CLAUDE_MAX_TOKENS, CLAUDE_PATCH = 1568, 1568, 28
PDF_PAGE_TOKENS = 2_000
AUDIO_TOKENS_PER_S = 10
HEADER_B64_CHARS = 64 * 1024  # an image's size is in its first bytes
PDF_SCAN_B64_CHARS = 16 * 1024 * 1024  # pages are counted in at most this much of a PDF
_PAGE = re.compile(rb"/Type\s*/Page(?!s)")


def part_tokens(part: dict[str, Any]) -> int:
    """The tokens of a non-text part (0 for a kind it does not know: its text, if any, is
    counted with the message's)."""
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        detail = image.get("detail") if isinstance(image, dict) else None
        return openai_image(_data_url_bytes(url), detail)
    if kind == "input_image":
        return openai_image(_data_url_bytes(part.get("image_url")), part.get("detail"))
    if kind == "image":
        return claude_image(_source_bytes(part.get("source")))
    if kind in ("document", "file", "input_file"):
        return _document(part)
    if kind == "input_audio":
        audio = part.get("input_audio")
        if isinstance(audio, dict):
            return _audio(audio.get("data"), audio.get("format"))
    return 0


def openai_image(header: bytes | None, detail: Any = None) -> int:
    if detail == "low":
        return OPENAI_BASE
    size = image_size(header) if header else None
    if size is None:
        return OPENAI_UNKNOWN
    width, height = size
    fit = min(1.0, 2048 / max(width, height))  # into 2048 x 2048, then the short side to 768
    scale = fit * min(1.0, 768 / (fit * min(width, height)))
    tiles = math.ceil(width * scale / 512) * math.ceil(height * scale / 512)
    return OPENAI_BASE + OPENAI_TILE * tiles


def claude_image(header: bytes | None) -> int:
    size = image_size(header) if header else None
    if size is None:
        return CLAUDE_MAX_TOKENS
    width, height = size
    scale = min(1.0, CLAUDE_MAX_EDGE / max(width, height))
    patches = math.ceil(width * scale / CLAUDE_PATCH) * math.ceil(height * scale / CLAUDE_PATCH)
    return min(CLAUDE_MAX_TOKENS, patches)


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, GIF, JPEG or WebP's first bytes."""
    try:
        return _image_size(data)
    except (struct.error, IndexError, ValueError):
        return None


def _image_size(data: bytes) -> tuple[int, int] | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        width, height = struct.unpack(">II", data[16:24])
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        width, height = struct.unpack("<HH", data[6:10])
    elif data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        width, height = _webp_size(data)
    elif data.startswith(b"\xff\xd8"):
        width, height = _jpeg_size(data)
    else:
        return None
    return (width, height) if width > 0 and height > 0 else None


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8X":
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if chunk == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    raise ValueError("not a WebP image")


def _jpeg_size(data: bytes) -> tuple[int, int]:
    at = 2
    while at + 9 < len(data):
        if data[at] != 0xFF:
            raise ValueError("not a JPEG marker")
        marker = data[at + 1]
        length = struct.unpack(">H", data[at + 2 : at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # start of frame
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    raise ValueError("no JPEG frame header in the first bytes")


def _data_url_bytes(url: Any, limit: int = HEADER_B64_CHARS) -> bytes | None:
    """The first bytes of a `data:...;base64,` URL (None for a remote URL)."""
    if not isinstance(url, str) or not url.startswith("data:"):
        return None
    comma = url.find(",", 0, 256)
    if comma < 0 or not url[:comma].endswith(";base64"):
        return None
    return _b64(url[comma + 1 : comma + 1 + limit])


def _source_bytes(source: Any, limit: int = HEADER_B64_CHARS) -> bytes | None:
    """An Anthropic source's first bytes (None for a URL or a file id)."""
    if isinstance(source, dict) and source.get("type") == "base64":
        data = source.get("data")
        return _b64(data[:limit]) if isinstance(data, str) else None
    return None


def _b64(text: str) -> bytes | None:
    text = text[: len(text) - len(text) % 4]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _document(part: dict[str, Any]) -> int:
    source = part.get("source")
    if isinstance(source, dict) and source.get("type") == "text":
        data = source.get("data")
        return math.ceil(len(data) / 4) if isinstance(data, str) else 0
    if isinstance(source, dict):
        pdf = _source_bytes(source, PDF_SCAN_B64_CHARS)
    else:
        file = part.get("file")
        data = file.get("file_data") if isinstance(file, dict) else part.get("file_data")
        pdf = _data_url_bytes(data, PDF_SCAN_B64_CHARS)
    pages = len(_PAGE.findall(pdf)) if pdf else 0
    return PDF_PAGE_TOKENS * max(1, pages)


def _audio(data: Any, kind: Any) -> int:
    if not isinstance(data, str):
        return 0
    size = len(data) * 3 // 4
    rate = 16_000  # bytes a second: 128 kbit/s
    header = _b64(data[:64])
    if kind == "wav" and header and header.startswith(b"RIFF") and len(header) >= 32:
        rate = int.from_bytes(header[28:32], "little") or rate
    return math.ceil(size / rate * AUDIO_TOKENS_PER_S)
