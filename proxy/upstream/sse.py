"""Splitting an SSE byte stream into events, in time and memory linear in the bytes.

Each chunk is scanned once: only the new bytes (plus one held byte, for a blank line split
across chunks) are searched for the separator, and an unfinished event is held in one growing
buffer, never re-split. An event that grows past `max_event_bytes` without ending is refused
(`EventTooLarge`), so a hostile upstream cannot make the proxy hold an endless event.
"""

from __future__ import annotations

SEPARATOR = b"\n\n"  # a blank line ends an event; CRLF is turned into LF first


class EventTooLarge(ValueError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"an SSE event reached {size} bytes without ending (limit {limit})")
        self.size = size
        self.limit = limit


class SSESplitter:
    """Feed it chunks as they arrive; it returns the events each chunk completed."""

    __slots__ = ("_cr_held", "_max_event_bytes", "_pending")

    def __init__(self, max_event_bytes: int) -> None:
        self._max_event_bytes = max_event_bytes
        self._pending = bytearray()  # the start of an event whose end has not arrived
        self._cr_held = False  # the last chunk ended in "\r": its "\n" may come next

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events `chunk` completed (without their blank line), in order."""
        if self._cr_held or b"\r" in chunk:
            chunk = self._lf_only(chunk)
        if self._pending:
            return self._continue(self._pending, chunk)
        return self._split(chunk)

    @property
    def holding(self) -> bool:
        """Whether the start of an unfinished event is held (the next feed's first event
        begins with earlier chunks' bytes)."""
        return bool(self._pending)

    def rest(self) -> bytes:
        """What is held when the stream ends: a last event sent without its blank line."""
        held = bytes(self._pending).strip()
        self._pending.clear()
        return held

    def _split(self, chunk: bytes) -> list[bytes]:
        # The common case: nothing held, events arrive whole; the split touches this chunk only.
        *events, rest = chunk.split(SEPARATOR)
        if rest:
            self._hold(rest)
        if len(chunk) > self._max_event_bytes:
            self._check_each(events)
        return _non_empty(events)

    def _continue(self, pending: bytearray, chunk: bytes) -> list[bytes]:
        scan_from = len(pending) - 1  # a "\n" held at the end may pair with one in the chunk
        pending += chunk
        end = pending.find(SEPARATOR, scan_from)
        if end == -1:
            if len(pending) > self._max_event_bytes:
                raise EventTooLarge(len(pending), self._max_event_bytes)
            return []
        if end > self._max_event_bytes:
            raise EventTooLarge(end, self._max_event_bytes)
        first = bytes(pending[:end])
        after = bytes(pending[end + 2 :])  # no longer than this chunk
        pending.clear()
        events = _non_empty([first])
        return events + self._split(after) if after else events

    def _hold(self, rest: bytes) -> None:
        if len(rest) > self._max_event_bytes:
            raise EventTooLarge(len(rest), self._max_event_bytes)
        self._pending += rest

    def _check_each(self, events: list[bytes]) -> None:
        for event in events:
            if len(event) > self._max_event_bytes:
                raise EventTooLarge(len(event), self._max_event_bytes)

    def _lf_only(self, chunk: bytes) -> bytes:
        if self._cr_held:
            chunk = b"\r" + chunk
            self._cr_held = False
        if chunk.endswith(b"\r"):
            chunk = chunk[:-1]
            self._cr_held = True
        return chunk.replace(b"\r\n", b"\n")


def _non_empty(events: list[bytes]) -> list[bytes]:
    """Extra blank lines between events are no events, and no part of the event they precede."""
    out = []
    for event in events:
        if event.startswith(b"\n"):
            event = event.lstrip(b"\n")
        if event:
            out.append(event)
    return out
