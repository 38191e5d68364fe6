"""What a valid configuration needs of this installation before it can be served: the optional
dependencies of the features it turns on. `serve` refuses to start without them and `validate`
says the same, so a file that validates here also starts here."""

from __future__ import annotations

from proxy.policies.spec import Config
from proxy.runtime.server import loop_unavailable
from proxy.tracing import unavailable


def startup_refusals(config: Config) -> list[str]:
    """Why this installation cannot serve `config`: one line per missing piece."""
    found = (unavailable(config.tracing), loop_unavailable(config.server.event_loop))
    return [why for why in found if why is not None]


def startup_refusal(config: Config) -> str | None:
    return "; ".join(startup_refusals(config)) or None
