"""Files that hold what the proxy was sent (the SQLite store and its log, the event log, the
runtime files) are its user's alone: created 0600, in folders created 0700, whatever the
umask. A file made by an earlier version with wider modes is narrowed when opened."""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str | os.PathLike[str]) -> Path:
    """The folder, created (with its missing parents) 0700 if absent; an existing one is left
    as it is (it may be shared, e.g. a volume's root)."""
    folder = Path(path)
    if not folder.is_dir():
        folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return folder


def private_file(path: str | os.PathLike[str]) -> None:
    """The file exists and only its owner may read or write it: created empty 0600 if absent,
    else narrowed."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        narrowed(path)


def narrowed(path: str | os.PathLike[str]) -> None:
    """An existing file of this user's made 0600 if it had wider modes; nothing if absent or
    someone else's (then its owner decides)."""
    try:
        if os.stat(path).st_mode & 0o077:
            os.chmod(path, FILE_MODE)
    except (FileNotFoundError, PermissionError):
        pass
