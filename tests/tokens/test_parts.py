"""Non-text parts cost tokens: images by the providers' rules (checked against litellm's own
counter and OpenAI's published examples), documents by page, audio by duration; every
message estimate includes them."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import pytest

from proxy.messages import estimate_tokens
from proxy.pipeline.compaction.budget import message_tokens
from proxy.tokens.parts import (
    CLAUDE_MAX_TOKENS,
    OPENAI_UNKNOWN,
    PDF_PAGE_TOKENS,
    claude_image,
    image_size,
    part_tokens,
)
from tests.tokens.litellm_reference import litellm


def png(width: int, height: int) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    return (
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    )


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\0" * 8


def jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0" + b"\0" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHH", 17, 8, height, width) + b"\0" * 10
    return b"\xff\xd8" + app0 + sof


def webp(width: int, height: int) -> bytes:
    size = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + b"\0" * 4 + b"WEBPVP8X" + b"\0" * 8 + size


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data + b"\0" * 32).decode()


def chat_image(data: bytes, detail: str = "high") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(data), "detail": detail}}


@pytest.mark.parametrize("make", [png, gif, jpeg, webp])
def test_image_sizes_are_read_from_the_first_bytes(make: Any) -> None:
    assert image_size(make(1234, 567)) == (1234, 567)
    assert image_size(b"not an image") is None


@pytest.mark.parametrize(
    "size, expected",
    [((1024, 1024), 765), ((2048, 4096), 1105), ((512, 512), 255), ((4000, 3000), 765)],
)
def test_openai_images_as_openai_publishes_and_litellm_counts(
    size: tuple[int, int], expected: int
) -> None:
    part = chat_image(png(*size))
    assert part_tokens(part) == expected  # OpenAI's examples: 765 for 1024², 1105 for 2048x4096
    with_image = [{"role": "user", "content": [part]}]
    without = [{"role": "user", "content": []}]
    counter = litellm().token_counter
    assert (
        counter(model="gpt-4o", messages=with_image) - counter(model="gpt-4o", messages=without)
        == expected
    )


def test_low_detail_remote_and_responses_images() -> None:
    assert part_tokens(chat_image(png(4000, 4000), detail="low")) == 85
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    assert part_tokens(remote) == OPENAI_UNKNOWN  # unknown size: the high side
    responses = {"type": "input_image", "image_url": data_url(png(1024, 1024)), "detail": "auto"}
    assert part_tokens(responses) == 765


def test_claude_images_by_28_pixel_patches_up_to_its_cap() -> None:
    def block(data: bytes) -> dict[str, Any]:
        source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data)}
        return {"type": "image", "source": {**source, "data": source["data"].decode()}}

    assert part_tokens(block(png(200, 200))) == 64  # 8 x 8 patches
    assert part_tokens(block(png(1092, 1092))) == 39 * 39
    assert part_tokens(block(png(4000, 3000))) == CLAUDE_MAX_TOKENS  # scaled, then capped
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    assert part_tokens(url) == CLAUDE_MAX_TOKENS
    assert claude_image(None) == CLAUDE_MAX_TOKENS


def pdf(pages: int) -> bytes:
    objects = b"".join(
        b"%d 0 obj << /Type /Page /Parent 2 0 R >> endobj\n" % i for i in range(pages)
    )
    return b"%PDF-1.7\n2 0 obj << /Type /Pages /Count 3 >> endobj\n" + objects + b"%%EOF"


def test_documents_by_page_and_text_documents_by_text() -> None:
    data = base64.b64encode(pdf(3)).decode()
    anthropic = {"type": "document", "source": {"type": "base64", "data": data}}
    assert part_tokens(anthropic) == 3 * PDF_PAGE_TOKENS
    chat = {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{data}"}}
    assert part_tokens(chat) == 3 * PDF_PAGE_TOKENS
    text = {"type": "document", "source": {"type": "text", "data": "x" * 400}}
    assert part_tokens(text) == 100


def test_audio_by_duration() -> None:
    wav = b"RIFF" + b"\0" * 24 + (32_000).to_bytes(4, "little") + b"\0" * 12 + b"\0" * 64_000
    part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"},
    }
    assert part_tokens(part) == 21  # ~2 s at 32 kB/s, 10 tokens a second (rounded up)


def test_message_estimates_include_non_text_parts() -> None:
    image = chat_image(png(1024, 1024))
    message = {"role": "user", "content": [{"type": "text", "text": "x" * 400}, image]}
    assert message_tokens(message) == estimate_tokens(message) == 4 + 100 + 765
    tool = {"role": "tool", "tool_call_id": "t", "content": [image, image]}
    assert message_tokens(tool) == estimate_tokens(tool) == 4 + 2 * 765
