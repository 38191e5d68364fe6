"""Which session a request belongs to: the client's own id first, else a fingerprint of the
history's beginning, which a route whose body is not chat-shaped supplies only when needed."""

from __future__ import annotations

from typing import Any

from proxy.sessions.identity import session_id

OPENING = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_a_named_session_never_builds_the_opening() -> None:
    def opening() -> list[dict[str, Any]]:
        raise AssertionError("built although the client named its session")

    named = session_id({"x-claude-code-session-id": "cc-1"}, {}, "alice", opening)
    assert (named.name, named.given) == ("cc-1", True)


def test_an_unnamed_session_is_the_fingerprint_of_its_opening() -> None:
    lazy = session_id({}, {}, "alice", lambda: OPENING)
    eager = session_id({}, {"messages": OPENING}, "alice")
    assert lazy == eager and not lazy.given and lazy.name.startswith("fp-")
    assert session_id({}, {}, "bob", lambda: OPENING) != lazy  # the key is in it
