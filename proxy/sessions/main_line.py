"""A session's main conversation told apart from its side calls: which calls can open a client
turn. The recording, the board and replay all ask `MainLine`; how a call's opening is read from
a wire's body is recording/conversation.py's (`opening`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Opening = tuple[int | None, int | None]  # digests of a call's system prompt, first user message


@dataclass(slots=True)
class MainLine:
    """A session's main conversation, told apart from its side calls: the one place that says
    which calls can open a client turn (the recording, the board and replay all ask it).

    Agents make side calls in the session of their main conversation: opencode asks for a
    title, Claude Code for a topic or a title, each a fresh conversation of one or two
    messages under a system prompt of its own, whose last message is a user's. A **side call**
    is a call that
      - is not the session's first (nor the first this process sees of it: the line is not
        known yet, so that call starts it), and
      - does not continue the call before it (shares none of its leading entries: turn N+1
        is turn N plus new messages), and
      - shares neither part of its *opening* with the main line's latest call: its system
        prompt (the system and developer messages before its first user message, inside or
        outside its list) and its first user message, each read as text (cache markers and
        other bytes a client moves between calls do not count; a part it lacks matches
        nothing).
    A side call never opens a client turn: it is a call of the turn it happens in. Any other
    call is on the main line and becomes its latest: a main call after a side call continues
    the side call's history no more than the side call did the main's, and its opening tells
    it back. The opening is what names a session without an id (sessions/identity.py): there
    the lineage (sessions/lineage.py) already keeps such a call out of the main conversation's
    family; a session id the client gives holds both, and this tells them apart.

    Either part matching keeps a call main: a history compacted into a new first message
    under the same system prompt, a system prompt that changed (a date, a header) above the
    same first message. A compaction request under a system prompt of its own (Claude
    Code's) is a side call.
    """

    opening: Opening | None = None  # the main line's latest call's; None: no call yet

    def side(self, continues: bool, opening: Callable[[], Opening]) -> bool:
        """Whether a call is a side call (`continues`: it shares its leading entries with the
        call before it; `opening`: its opening, read only when needed); the line moves to a
        call that is not."""
        main = self.opening
        if continues and main is not None:
            return False  # the common call: the history grew, its opening is the line's
        mine = opening()
        if (
            main is None
            or continues
            or any(a is not None and a == b for a, b in zip(mine, main, strict=True))
        ):
            self.opening = mine
            return False
        return True


@dataclass(frozen=True, slots=True)
class CallReading:
    """A call as its session's client turns count it: `prompt`, its new entries end with a
    person's words (`opens_in`); `continues`, it shares its leading entries with the
    session's call before it; `opening` reads its opening, only when the line needs it."""

    prompt: bool
    continues: bool
    opening: Callable[[], Opening]

    def counted(self, line: MainLine, first: bool) -> tuple[bool, bool]:
        """Whether the call opens a client turn and whether it is a side call, the line moved
        past it: the first call opens one whatever it holds, a side call never."""
        side = line.side(self.continues, self.opening)
        return first or (self.prompt and not side), side
