"""Request ids: the proxy's own are UUIDs (version 4), the one shape every upstream accepts.

Some servers validate the `X-Request-Id` they are sent: llama-cpp-python's (starlette-context)
answers any id that is not a UUID with a 400 and an empty body. So a client's own id is echoed
back to the client and logged, but goes upstream only when it is UUID-shaped.
"""

from __future__ import annotations

import os
import re

UUID_SHAPE = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def new_request_id() -> str:
    """A random UUID4 string, without the cost of building a uuid.UUID object."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def is_uuid(value: str) -> bool:
    return len(value) == 36 and UUID_SHAPE.fullmatch(value) is not None
