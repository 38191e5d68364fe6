"""Admin surface, behind the admin key: the active configuration and reloading it (a JSON
POST: proxy/http/auth.py says who else is let in; every reload, applied or refused, is
audited: proxy/recording/audit.py)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.errors import UnsupportedMediaType
from proxy.policies.spec import Config, Policy
from proxy.redaction import redact_url
from proxy.routes.admin_auth import actor, admin_caller
from proxy.state import AUDIT, CONFIG, CONTROL

routes = web.RouteTableDef()


@routes.get("/admin/policies")
async def show_policies(request: web.Request) -> web.Response:
    await admin_caller(request)
    holder = request.app[CONFIG]
    config = holder.current
    return _json(
        {
            "version": config.version,
            "sources": list(config.sources),
            "loaded_at": config.loaded_at,
            "last_reload": holder.last_reload.describe() if holder.last_reload else None,
            "warnings": list(config.warnings),
            "notes": list(config.notes),  # what was inferred or mapped (a LiteLLM config)
            "models": _models(config),
            "policies": [_policy(p) for p in config.policies],
            "circuits": request.app[CONTROL].describe(),
        }
    )


@routes.post("/admin/reload")
async def reload(request: web.Request) -> web.Response:
    who = await admin_caller(request)
    holder = request.app[CONFIG]
    require_json(request)
    outcome = await holder.reload("admin", actor(request, who))
    await request.app[AUDIT].settled()  # its entry readable when the answer is
    if outcome.ok:
        return _json(outcome.describe())
    error = {
        "message": "the new configuration is invalid; the previous one keeps serving",
        "type": "invalid_config",
        "param": None,
        "code": "config_rejected",
        "details": list(outcome.errors),
        "active_version": outcome.version,
    }
    return _json({"error": error}, status=422)


def require_json(request: web.Request) -> None:
    """A route that changes state takes JSON only: a page of another site can send a
    text/plain or form POST without asking the browser's leave (CORS), never a JSON one."""
    if request.content_type != "application/json":
        raise UnsupportedMediaType(
            f"{request.method} {request.path} takes 'Content-Type: application/json' (an empty "
            f"body or {{}} will do), not {request.headers.get('Content-Type', 'none')[:100]!r}"
        )


def _models(config: Config) -> dict[str, list[dict[str, Any]]]:
    return {
        alias: [
            {
                "model": d.model,
                "api_base": redact_url(d.base_url) if d.base_url else None,
                "path": "openai-compatible" if d.fast_path else "litellm",
                "max_input_tokens": d.max_input_tokens,
                "source": d.source,
            }
            for d in group
        ]
        for alias, group in config.deployments.items()
    }


def _policy(policy: Policy) -> dict[str, Any]:
    match = policy.match
    return {
        "name": policy.name,
        "mode": policy.mode,
        "description": policy.description,
        "match": {
            "models": sorted(match.models) if match.models is not None else None,
            "keys": sorted(match.keys) if match.keys is not None else None,
            "headers": dict(match.headers),
        },
    }


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")
