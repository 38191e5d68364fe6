"""Whose each Responses id is: the wall between tenants that share the provider's account.

Every tenant's responses live in the operator's one account at the provider, so a
`previous_response_id` works for whoever knows it. With API keys configured, the proxy records
which owner (the key, or its team with `keys.session_scope: team`) each response id it relayed
belongs to, and answers any other id, another owner's or one it never saw, exactly as the
provider answers an unknown one, without calling it: nobody learns whether the id exists.
A `conversation` is refused the same way: conversations are created by /v1/conversations,
which the proxy does not serve, so no tenant's conversation was ever created through it. So is
an input item that names a stored item by id (`item_reference`): items are not recorded.

One record per id, in the durable store (SQLite or Redis, so a restart keeps them): a
checkpoint of a session of its own, `scoped(owner, "responses:" + id)`, which retention expires
`store.session_ttl` after it was written. The lookup names the caller's owner, so it can only
find the caller's own records. With no keys (one loopback user) nothing is recorded or checked.

When is the record written? Before the client sees the id, it must be findable by whatever
serves the client's next turn. With Redis that may be another replica, so the write is awaited
(~0.3 ms). The embedded store has one process: the write (a committed SQLite transaction,
~0.7 ms) goes on after the answer, and until it lands the id is found among the writes in
flight here.

A record that cannot be written (Redis down or restarting) would make an id nobody can
continue: with Redis the answer is then not given but refused, 503 `store_unavailable`, as a
lookup that cannot be made is. A stream has shown its id in `response.created` already; it
ends with that error event instead of `response.completed`, so the client holds no completed
response to continue. A response made with `store: false` needs no record and is answered.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, TypeGuard

from proxy.errors import BadRequest, NotFound, ServiceUnavailable
from proxy.logs.limit import warn_limited
from proxy.sessions.identity import scoped
from proxy.store.base import Store, StoreError

log = logging.getLogger("agentproxy")

SESSION_PREFIX = "responses:"
RECORD_KEY = "response-owner"  # never a compaction checkpoint's key (hex digits, or its index)
MAX_ID_CHARS = 256  # longer is no provider's id: refused as unknown, never stored
MAX_ITEMS_RECORDED = 64  # output items of one response recorded as its caller's


def _session(owner: str, response_id: str) -> str:
    return scoped(owner, SESSION_PREFIX + response_id)


def _recordable(response_id: Any) -> TypeGuard[str]:
    return isinstance(response_id, str) and 0 < len(response_id) <= MAX_ID_CHARS


# Records being written to an unshared store, by session: what the store will hold. Bounded by
# the writes in flight (each removes itself when done); holds the tasks, which asyncio does not.
_writing: dict[str, asyncio.Task[None]] = {}


def _written(session: str, task: asyncio.Task[None]) -> None:
    if _writing.get(session) is task:  # not a later write of the same record
        del _writing[session]
    if not task.cancelled() and task.exception() is not None:  # no caller to raise it to
        log.error("recording a response's owner failed", exc_info=task.exception())


class ResponseOwners:
    """One request's view of the records: its caller's owner and the store."""

    def __init__(self, store: Store, owner: str) -> None:
        self.store = store
        self.owner = owner

    async def record(self, response: Any) -> None:
        """Note that the caller owns the response the upstream answered with, and its output
        items (a later turn may name them by id: an `item_reference`, a reasoning item sent
        back without its `encrypted_content`). A shared store's write is awaited, and when it
        fails the answer is not given (ServiceUnavailable, `store_unavailable`): an id handed
        out without its record could never be continued. The embedded store's lost write is
        logged."""
        sessions = [_session(self.owner, found) for found in _owned_ids(response)]
        if not sessions:
            return
        if self.store.shared:
            try:
                await asyncio.gather(*(self._write(session) for session in sessions))
            except StoreError as exc:
                _say_lost(exc)
                raise unrecorded() from exc
            return
        task = asyncio.ensure_future(self._write_all(sessions))
        for session in sessions:
            _writing[session] = task
            task.add_done_callback(functools.partial(_written, session))

    async def _write_all(self, sessions: list[str]) -> None:
        try:
            for session in sessions:
                await self._write(session)
        except StoreError as exc:
            _say_lost(exc)

    async def _write(self, session: str) -> None:
        await self.store.put_checkpoint(session, RECORD_KEY, b"1")

    async def check(self, body: dict[str, Any]) -> None:
        """Refuse a `previous_response_id` the caller does not own, and any `conversation`,
        as the provider refuses unknown ones. Costs nothing when neither is sent."""
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise BadRequest(
                    "Invalid type for 'previous_response_id': expected a string.",
                    param="previous_response_id",
                    code="invalid_type",
                )
            if not await self._owns(previous):
                raise previous_response_not_found(previous)
        conversation = body.get("conversation")
        if conversation is not None:
            raise conversation_not_found(conversation)

    async def check_items(self, references: list[Any], reasoning: list[tuple[str, Any]]) -> None:
        """Refuse input items that name a stored item by id (`item_reference`; a reasoning item
        without its `encrypted_content`, at `where`) unless an earlier response of the caller's
        own owner made it: the provider would look it up in the account every tenant shares."""
        for item_id in references:
            if not (isinstance(item_id, str) and await self._owns(item_id)):
                raise item_not_found(item_id)
        for where, item_id in reasoning:
            if not (isinstance(item_id, str) and await self._owns(item_id)):
                raise reasoning_not_found(where)

    async def _owns(self, response_id: str) -> bool:
        if not _recordable(response_id):
            return False
        session = _session(self.owner, response_id)
        if session in _writing:
            return True
        try:
            found = await self.store.get_checkpoint(session, RECORD_KEY)
        except StoreError as exc:  # fail closed: an unchecked id could be anyone's
            raise ServiceUnavailable(
                "the proxy's store is unavailable, so 'previous_response_id' cannot be checked; "
                "retry later, or send the whole input instead",
                code="store_unavailable",
            ) from exc
        return found is not None


def _say_lost(exc: StoreError) -> None:
    # An outage fails every write: said once a minute.
    warn_limited(log, "responses.owner_record",
                 "could not record the owner of a response (%s): it cannot be continued",
                 exc)  # fmt: skip


def unrecorded() -> ServiceUnavailable:
    """The answer, when the record of the id it carries cannot be written: not given (the id
    would answer `previous_response_not_found` ever after), the client asked to retry."""
    error = ServiceUnavailable(
        "the proxy's store is unavailable, so the owner of this response could not be recorded "
        "and it could not be continued: not answered; retry later",
        code="store_unavailable",
    )
    error.unsent = True  # no upstream's fault
    return error


def _owned_ids(response: Any) -> list[str]:
    """The ids a reply makes its caller's: the response's, and its output items' (at most
    MAX_ITEMS_RECORDED: no real reply has more)."""
    if not isinstance(response, dict) or not _recordable(response.get("id")):
        return []
    ids = [response["id"]]
    output = response.get("output")
    if isinstance(output, list):
        for item in output[:MAX_ITEMS_RECORDED]:
            if isinstance(item, dict) and _recordable(item_id := item.get("id")):
                ids.append(item_id)
    return ids


def continues(body: dict[str, Any]) -> bool:
    """Whether a request names history kept at the provider (the only ones checked)."""
    return "previous_response_id" in body or "conversation" in body


def previous_response_not_found(response_id: str) -> BadRequest:
    """OpenAI's own answer for an id it does not have (status, type, code, text)."""
    return BadRequest(
        f"Previous response with id '{response_id[:MAX_ID_CHARS]}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def conversation_not_found(conversation: Any) -> NotFound:
    given = conversation.get("id") if isinstance(conversation, dict) else conversation
    shown = given[:MAX_ID_CHARS] if isinstance(given, str) else ""
    return NotFound(f"Conversation with id '{shown}' not found.", param="conversation")


def item_not_found(item_id: Any) -> NotFound:
    """An input item naming a stored item by id (`item_reference`) that no response of the
    caller's owner made."""
    shown = item_id[:MAX_ID_CHARS] if isinstance(item_id, str) else ""
    return NotFound(f"Item with id '{shown}' not found.", param="input")


def reasoning_not_found(where: str) -> BadRequest:
    return BadRequest(
        f"'{where}' is a reasoning item without its 'encrypted_content', and no response made "
        "through this proxy for this key has its id: the provider would look it up by id in an "
        "account every key shares. Send it with the 'encrypted_content' the reply carried "
        '(include: ["reasoning.encrypted_content"]), or continue with previous_response_id',
        param=where,
        code="stored_object_refused",
    )
