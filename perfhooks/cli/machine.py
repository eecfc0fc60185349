"""Machine output: a command asked for JSON (``--format json``, ``--json``) writes only its JSON on standard output.

Third-party packages print while a command imports them: transformers prints "[INFO] Running in WANDB offline
mode" on import when ``WANDB_MODE=offline`` is set, as it is on many clusters. While such a command runs,
whatever is printed to ``sys.stdout`` goes to standard error, and the command's own document goes to the
standard output it started with (:func:`out`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO

_out: TextIO | None = None


def out() -> TextIO:
    """Where a command's own output goes: the standard output it started with."""
    return _out if _out is not None else sys.stdout


@contextlib.contextmanager
def machine_output(on: bool) -> Iterator[None]:
    """While the command runs (``on``: it writes JSON), everything else printed to stdout goes to stderr."""
    global _out
    if not on:
        yield
        return
    _out = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _out = None
