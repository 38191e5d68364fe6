"""The proxy's own response headers: which model, policy and session answered, and what the
proxy did (`x-agentproxy-applied`)."""

from __future__ import annotations

from proxy.exchange import Exchange


def proxy_headers(ex: Exchange) -> dict[str, str]:
    headers = {
        "x-agentproxy-model": ex.alias,
        "x-agentproxy-policy": ex.policy.name,
        "x-agentproxy-session": ex.identity.session_name,
    }
    if ex.prompt is not None:  # the prompt size its decisions took: counted, calibrated
        headers["x-agentproxy-prompt-tokens"] = str(ex.prompt.estimate)
    if ex.notes:
        headers["x-agentproxy-applied"] = applied_header(ex)
    if ex.dry_run:
        headers["x-agentproxy-dry-run"] = "true"
    return headers


def applied_header(ex: Exchange) -> str:
    """What the proxy did, compactly: `stage.action;count=2;tokens=9000>1500, ...`."""
    parts = []
    for note in ex.notes:
        part = f"{note.stage}.{note.action}"
        if "count" in note.fields:
            part += f";count={note.fields['count']}"
        if "tokens_before" in note.fields and "tokens_after" in note.fields:
            part += f";tokens={note.fields['tokens_before']}>{note.fields['tokens_after']}"
        parts.append(part)
    return ", ".join(parts)
