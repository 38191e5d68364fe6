"""A budget's downgrade: past a limit whose budget names a cheaper alias (`on_exhausted`), the
request is served there instead of refused. The budget guard (proxy/pipeline/budget.py) says
so by raising `Downgrade`; control switches the exchange to the alias and fits the client's
history to it again, as a fallback does (Control.downgrade)."""

from __future__ import annotations

from proxy.errors import ProxyError


class Downgrade(ProxyError):
    """The refusal a cheaper alias avoids: `alias` serves instead, for `budget`. Were it ever
    left unhandled it answers exactly as the refusal it stands for."""

    unsent = True

    def __init__(self, refusal: ProxyError, alias: str, budget: str, limit: str) -> None:
        super().__init__(refusal.message, code=refusal.code, headers=refusal.headers)
        self.status, self.type = refusal.status, refusal.type
        self.refusal = refusal
        self.alias = alias
        self.budget = budget
        self.limit = limit

    def body(self, request_id: str | None) -> dict[str, object]:
        return self.refusal.body(request_id)
