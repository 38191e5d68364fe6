"""OpenAI `compaction` items the proxy mints, and reading them back.

A compaction the proxy carried out (POST /v1/responses/compact, `context_management`, Codex's
`compaction_trigger`) is answered with an item in OpenAI's shape,
`{"type": "compaction", "id": "cmp_...", "encrypted_content": "apc1...."}`, whose content only the
proxy can read: it names the stored summary (a blob of the session's archive, kind
`compaction`, owned by the tenant that asked) and carries an HMAC-SHA256 over that name and the
owner, under a random key kept with the summary in the store. Any replica sharing the store
verifies it; another tenant presenting it, or an altered one, is refused (400, naming the
input index). An item whose content does not start with `apc1.` is the provider's own (OpenAI
mints `gAAAA...`): it is passed on as it is to a deployment that serves Responses natively.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import BadRequest
from proxy.exchange import Exchange
from proxy.pipeline.archive import Archive, entry
from proxy.store.base import Store, StoreError

KIND = "compaction"  # the archive kind of a minted item's summary
PREFIX = "apc1."  # what the proxy's encrypted_content starts with
MAX_CONTENT = 4_096  # an item of ours is ~150 bytes; more is not ours
MAX_SUMMARY_BYTES = 1024 * 1024


def is_compaction(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "compaction"


def is_minted(item: Any) -> bool:
    """A compaction item whose content claims to be the proxy's (verified by `read`)."""
    content = item.get("encrypted_content") if is_compaction(item) else None
    return isinstance(content, str) and content.startswith(PREFIX)


def _mac(key: bytes, owner: str, ref: str) -> str:
    message = b"agentproxy-compaction\0" + owner.encode() + b"\0" + ref.encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def mint(ex: Exchange, archive: Archive, summary: str, **meta: Any) -> dict[str, Any]:
    """Store `summary` in the session's archive (its owner's) and the item that names it."""
    key = os.urandom(32)
    record = {"summary": summary, "key": key.hex(), "created_at": int(time.time()), **meta}
    stored = entry(ex, KIND, orjson.dumps(record), chars=len(summary), **meta)
    if stored.ref not in await archive.keep(ex, KIND, [stored]):
        raise StoreError("the compaction summary could not be stored")
    owner = ex.identity.owner
    token = _b64(orjson.dumps({"ref": stored.ref, "mac": _mac(key, owner, stored.ref)}))
    return {
        "type": "compaction",
        "id": f"cmp_{stored.ref.removeprefix('ap_')}",
        "encrypted_content": PREFIX + token,
    }


@dataclass(frozen=True, slots=True)
class Summary:
    """What a minted item stands for: the summary text, and the archive ref it is kept under."""

    ref: str
    text: str


async def read(store: Store, owner: str, item: dict[str, Any], index: int) -> Summary:
    """The summary a minted item names, if it was minted for `owner`; else a 400 naming
    `input[index]` (altered, another tenant's, or its summary gone with the session's
    retention)."""
    param = f"input[{index}]"
    ref, mac = _parse(item.get("encrypted_content"))
    if ref is None or mac is None:
        raise _invalid(param, "its encrypted_content is not the proxy's")
    try:
        found = await store.get(ref)
    except StoreError as exc:
        raise _invalid(param, f"it cannot be read now ({exc})") from None
    record = _record(found, owner)
    key = record.get("key") if record else None
    valid = isinstance(key, str) and hmac.compare_digest(_mac(bytes.fromhex(key), owner, ref), mac)
    if record is None or not valid:
        raise _invalid(
            param,
            "it was not minted by this proxy for this API key (altered, another key's, "
            "or expired with its session)",
        )
    return Summary(ref, str(record.get("summary", "")))


def _invalid(param: str, why: str) -> BadRequest:
    return BadRequest(
        f"{param}: invalid compaction item: {why}", param=param, code="invalid_compaction_item"
    )


def _parse(content: Any) -> tuple[str | None, str | None]:
    if not isinstance(content, str) or len(content) > MAX_CONTENT or not content.startswith(PREFIX):
        return None, None
    try:
        data = orjson.loads(_unb64(content[len(PREFIX) :]))
    except (ValueError, binascii.Error):
        return None, None
    if not isinstance(data, dict):
        return None, None
    ref, mac = data.get("ref"), data.get("mac")
    if not (isinstance(ref, str) and ref.startswith("ap_") and isinstance(mac, str)):
        return None, None
    return ref, mac


def _record(found: Any, owner: str) -> dict[str, Any] | None:
    if found is None:
        return None
    info, data = found
    # Open proxies record no owner (None); keyed ones the tenant's name.
    if info.kind != KIND or (info.owner or "") != (owner or "") or len(data) > MAX_SUMMARY_BYTES:
        return None
    try:
        record = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None
