"""Atomic file writes: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


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


class TooLarge(OSError):
    """A streamed write passed its byte limit: nothing was written."""


def atomic_write_bytes(path: Path, data: bytes, durable: bool = False) -> None:
    """``data`` into ``path`` atomically. ``durable``: on disk before this returns (``fsync`` of the file, then of
    its folder, so the rename survives a crash or a host OOM-kill right after): the final report, OOM dumps."""
    atomic_write_stream(path, lambda handle: handle.write(data), durable=durable)


def atomic_write_stream(path: Path, write: Callable[[BinaryIO], Any], limit: int | None = None,
                        durable: bool = False) -> int:
    """What ``write(handle)`` writes, into ``path`` atomically, streamed (never whole in memory); its size in
    bytes. Past ``limit`` bytes the write stops and :class:`TooLarge` is raised: nothing is left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as raw:
            handle = _Bounded(raw, limit) if limit is not None else raw
            write(handle)  # type: ignore[arg-type]
            size = raw.tell()
            if durable:
                raw.flush()
                os.fsync(raw.fileno())
        os.replace(temp, path)
    except BaseException:
        _remove_quietly(temp)
        raise
    if durable:
        _fsync_folder(path.parent)
    return size


class _Bounded:
    """A binary file that refuses to grow past ``limit`` bytes."""

    def __init__(self, raw: BinaryIO, limit: int) -> None:
        self._raw, self._left = raw, limit

    def write(self, data: bytes) -> int:
        self._left -= len(data)
        if self._left < 0:
            raise TooLarge(f"over the limit of {self._left + len(data)} bytes left")
        return self._raw.write(data)


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a folder be opened or synced
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_json(path: Path, payload: Any, durable: bool = False) -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=False) + "\n").encode(), durable=durable)


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


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None where there is none (no file, not JSON, not an object). Files written
    by :func:`atomic_write_json` are never half-written, so None means "not there yet" or "not ours"."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
