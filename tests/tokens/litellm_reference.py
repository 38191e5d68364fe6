"""litellm itself, imported once for the tests that check the proxy's counts against it (the
proxy reads litellm's bundled files and rules without importing it)."""

from __future__ import annotations

import functools
import os
from typing import Any


@functools.cache
def litellm() -> Any:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no cost-map download at import
    import litellm as module

    return module
