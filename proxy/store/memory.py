"""A Store kept in process memory: for tests and for deployments that want no disk state."""

from __future__ import annotations

from collections.abc import Mapping

from proxy.store.base import RECORDING_KINDS, BlobInfo, snippet
from proxy.store.listing import Listed, fair
from proxy.store.shares import session_owner


class MemoryStore:
    shared = False  # one process owns it

    def __init__(self) -> None:
        self._blobs: dict[str, tuple[BlobInfo, bytes]] = {}
        self._checkpoints: dict[tuple[str, str], bytes] = {}
        self._listed: dict[str, Listed] = {}

    async def put(self, info: BlobInfo, data: bytes) -> None:
        self._blobs.setdefault(info.ref, (info, data))

    async def put_many(
        self, items: list[tuple[BlobInfo, bytes]], listed: Mapping[str, Listed] | None = None
    ) -> None:
        for info, data in items:
            turn = (listed or {}).get(info.ref)
            if turn is not None and info.ref not in self._blobs:
                self._list(turn)
            await self.put(info, data)

    async def put_listed(self, entries: list[Listed]) -> None:
        held = {info.session for info, _ in self._blobs.values()}
        for entry in entries:
            if entry.session in held:
                self._list(entry)

    async def put_unrecorded(self, entries: list[Listed]) -> None:
        for entry in entries:  # kept for the process's life: nothing expires here
            self._list(entry)
            self._listed[entry.session].turns = max(1, self._listed[entry.session].turns)

    def _list(self, turn: Listed) -> None:
        entry = self._listed.setdefault(turn.session, Listed(turn.session))
        entry.add(turn)

    async def listed(self, owner: str | None, limit: int) -> list[Listed]:
        owners: dict[str, list[Listed]] = {}
        for entry in sorted(self._listed.values(), key=lambda e: e.last_at, reverse=True):
            if owner is None or session_owner(entry.session) == owner:
                owners.setdefault(session_owner(entry.session), []).append(entry)
        ranked = [[(e.session, e.last_at) for e in mine] for mine in owners.values()]
        picked = [self._listed[session] for session in fair(ranked, limit)]
        return sorted(picked, key=lambda e: e.last_at, reverse=True)

    async def listed_one(self, session: str) -> Listed | None:
        return self._listed.get(session)

    async def get(self, ref: str) -> tuple[BlobInfo, bytes] | None:
        return self._blobs.get(ref)

    async def blobs(self, session: str) -> list[BlobInfo]:
        return [info for info, _ in self._blobs.values() if info.session == session]

    async def search(self, session: str, phrase: str, limit: int = 5) -> list[tuple[BlobInfo, str]]:
        needle = phrase.lower()
        found: list[tuple[BlobInfo, str]] = []
        for info, data in self._blobs.values():
            text = data.decode("utf-8", "replace")
            at = text.lower().find(needle)
            if info.session == session and at >= 0 and info.kind not in RECORDING_KINDS:
                found.append((info, snippet(text, at, len(phrase))))
                if len(found) >= limit:
                    break
        return found

    async def get_checkpoint(self, session: str, key: str) -> bytes | None:
        return self._checkpoints.get((session, key))

    async def put_checkpoint(self, session: str, key: str, data: bytes) -> None:
        self._checkpoints[(session, key)] = data

    async def probe(self) -> None:
        pass  # memory always takes a write

    async def close(self) -> None:
        pass
