"""A running proxy's /metrics, scraped over its socket, and one sample read from the text."""

from __future__ import annotations

import re

import aiohttp
from aiohttp.test_utils import TestServer


async def metrics_of(proxy: TestServer) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(proxy.make_url("/metrics")) as response:
            return await response.text()


def sample(metrics: str, name: str, **labels: str) -> float:
    """The sample `name{labels}` (labels exactly these), 0.0 when absent."""
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    found = re.search(rf"^{name}\{{{re.escape(shown)}\}} (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0
