"""Atomic file writes and directory locks for pipeline/: export/fileio.py's.

``aiayn.export.fileio`` is the one implementation (export/ may not import pipeline/, so it lives
there; its docstring says how the writes, the locks and the fault points work). This module
re-exports it, with one difference: a lock held by another live process is the user's mistake
to fix (wait, or stop the other run), so pipeline/'s :class:`LockHeld` is a
:class:`UserInputError`, which the command line reports as one message without a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager

from aiayn.export import fileio as _fileio
from aiayn.export.fileio import (
    atomic_output,
    atomic_write,
    describe_holder,
    fault_point,
    fsync_dir,
    leftover_target,
    remove_leftovers,
)
from aiayn.pipeline.errors import UserInputError

__all__ = ["LockHeld", "atomic_output", "atomic_write", "describe_holder", "fault_point",
           "fsync_dir", "hold_lock", "leftover_target", "remove_leftovers"]


class LockHeld(_fileio.LockHeld, UserInputError):
    """Another live process holds the lock; ``holder`` is what it wrote (may be empty)."""


def hold_lock(path: str | os.PathLike, what: str, wait_s: float = 0.0,
              on_wait: Callable[[str], None] | None = None) -> AbstractContextManager[dict]:
    """:func:`aiayn.export.fileio.hold_lock`, raising this module's :class:`LockHeld`.

    ``what`` names what the lock protects, for the message (``"run directory runs/x"``).
    """
    return _fileio.hold_lock(path, what, wait_s, on_wait, error=LockHeld)
