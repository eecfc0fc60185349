"""Atomic file writes: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _temp_beside(path: Path) -> tuple[int, str]:
    """A temp file next to ``path`` (same filesystem, so the rename is atomic), with normal permissions."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, _FILE_MODE)
    return fd, temp


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        _remove_quietly(temp)
        raise


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=False) + "\n").encode())


def atomic_gzip_file(source: Path, path: Path) -> None:
    """Gzip ``source`` into ``path`` atomically, then delete ``source``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as out, \
                open(source, "rb") as src:
            shutil.copyfileobj(src, out, length=1 << 20)
        os.replace(temp, path)
    except BaseException:
        _remove_quietly(temp)
        raise
    finally:
        _remove_quietly(source)


def _remove_quietly(path: str | Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
