"""How a guard decision is reported: applied, or (dry run) only computed. Every guard part
(tool-call rules, secrets) names its decisions through `reported`, so a dry run reads
`guard.would_deny`, `guard.would_scrub`, … in `x-agentproxy-applied`, the event log, the
metric and the inspector, and changes nothing."""

from __future__ import annotations

from proxy.exchange import Exchange

STAGE = "guard"  # the stage every guard event is recorded under
DRY_PREFIX = "would_"


def dry_run(ex: Exchange) -> bool:
    """The guard computes and reports, and applies nothing: its own mode, or the policy's."""
    return ex.dry_run or ex.policy.guard.mode == "dry_run"


def reported(ex: Exchange, action: str) -> str:
    """The action as recorded: `deny` applied, `would_deny` in a dry run."""
    return DRY_PREFIX + action if dry_run(ex) else action
