"""Whether the proxy answering on a port is one this user started: what `agentproxy run` asks
before it points an agent (and the prompts, and a key) at it.

Anything on the machine can listen on a free port and answer `/healthz` with `{"status":
"ok"}`. So `serve` makes a random secret, and once it listens writes it, with its port and
process id, to a runtime file only its user can read: `proxy-PORT.json`, 0600, in
`$XDG_RUNTIME_DIR/agentproxy` (else `~/.local/state/agentproxy`), a folder made 0700. `run`
reads the file of the port it would use, sends a random nonce with `GET /healthz` in the
`x-agentproxy-challenge` header, and uses the proxy only if the answer's `proof` is the
HMAC-SHA256, keyed with the secret, of `PORT:NONCE`, PORT being the one the connection arrived
on. The secret never crosses the wire; a process that cannot read the file cannot answer; one
that relays the challenge to a real proxy on another port gets a proof for that other port.
The file is removed when `serve` stops (a file left by a killed proxy proves nothing to a
process that later takes its port).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import aiohttp

from proxy.store.files import DIR_MODE, FILE_MODE

CHALLENGE_HEADER = "x-agentproxy-challenge"
MAX_NONCE_CHARS = 128  # a longer challenge is not answered
# A refused port answers at once; a proxy of ours on a loaded machine may take seconds.
PROBE_TIMEOUT_S = 5.0
MAX_FILE_BYTES = 4096
Probe = Literal["ours", "foreign", "none"]  # a proxy of ours; something else; nothing


def new_secret() -> str:
    return secrets.token_hex(32)


def proof(secret: str, port: int, nonce: str) -> str:
    return hmac.new(secret.encode(), f"{port}:{nonce}".encode(), hashlib.sha256).hexdigest()


def answer_challenge(secret: str | None, port: int, nonce: str | None) -> str | None:
    """The `proof` a proxy with `secret` gives for `nonce` on `port`; None when it has no secret
    or the challenge is not one."""
    if secret is None or not nonce or len(nonce) > MAX_NONCE_CHARS:
        return None
    return proof(secret, port, nonce)


def runtime_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where this user's runtime files are; None when there is no place for them (no
    XDG_RUNTIME_DIR nor HOME)."""
    base = environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(base):
        return Path(base) / "agentproxy"
    home = environ.get("HOME", "")
    return Path(home) / ".local" / "state" / "agentproxy" if os.path.isabs(home) else None


def _private_folder(folder: Path) -> bool:
    """Whether `folder` is (now) a directory of this user's that nobody else may enter."""
    with contextlib.suppress(FileExistsError):
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=DIR_MODE)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        return False
    if found.st_mode & 0o077:
        os.chmod(folder, DIR_MODE)
    return True


def claim(port: int, secret: str, environ: Mapping[str, str] = os.environ) -> Path:
    """Write the runtime file of the proxy listening on `port`; its path. OSError when it
    cannot be written (`run` will then not use this proxy)."""
    folder = runtime_dir(environ)
    if folder is None:
        raise OSError("no XDG_RUNTIME_DIR nor HOME to keep the runtime file in")
    if not _private_folder(folder):
        raise OSError(f"{folder} is not a directory of this user's")
    path = folder / f"proxy-{port}.json"
    partial = folder / f".proxy-{port}-{os.getpid()}.partial"
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "w") as out:
        json.dump({"port": port, "pid": os.getpid(), "secret": secret}, out)
    os.replace(partial, path)
    return path


def release(path: Path, secret: str) -> None:
    """Remove the runtime file, unless another proxy has claimed the port since."""
    if _secret_in(path) == secret:
        with contextlib.suppress(OSError):
            path.unlink()


def _secret_in(path: Path) -> str | None:
    """The secret of a runtime file of this user's alone; None for anything else."""
    try:
        with open(path, "rb") as file:
            found = os.fstat(file.fileno())
            if found.st_uid != os.getuid() or found.st_mode & 0o077:
                return None  # someone else could have written or read it
            data = json.loads(file.read(MAX_FILE_BYTES))
    except (OSError, ValueError):
        return None
    secret = data.get("secret") if isinstance(data, dict) else None
    return secret if isinstance(secret, str) and secret else None


async def probe(port: int, host: str = "127.0.0.1", environ: Mapping[str, str] = os.environ
                ) -> Probe:  # fmt: skip
    """What answers `/healthz` on `port`: a proxy this user started ("ours"), something that
    cannot prove it is one ("foreign"), or nothing ("none")."""
    folder = runtime_dir(environ)
    secret = _secret_in(folder / f"proxy-{port}.json") if folder is not None else None
    nonce = secrets.token_hex(16)
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            async with http.get(f"http://{host}:{port}/healthz",
                                headers={CHALLENGE_HEADER: nonce}) as response:  # fmt: skip
                body = await response.content.read(MAX_FILE_BYTES)
    except (aiohttp.ClientError, TimeoutError):
        return "none"
    try:
        answer = json.loads(body)
    except ValueError:
        return "foreign"
    given = answer.get("proof") if isinstance(answer, dict) else None
    if secret is None or not isinstance(given, str):
        return "foreign"
    return "ours" if hmac.compare_digest(given, proof(secret, port, nonce)) else "foreign"
