"""Atomic file writes for pipeline/: a temporary file in the same directory, fsync, then a rename.

A reader (a watching server, a resumed run, a user's `cat`) sees the old file or the new one,
never half of one; an interrupted write leaves at most a ``.<name>.*.tmp`` file, never a partial
``<name>``. Files get the usual mode (0666 minus the umask, 0644 by default), not ``mkstemp``'s
0600. (``export/`` has its own copy in ``aiayn.export.fileio``: it may not import pipeline/.)
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` for writers that need a file name (HDF5, TFRecord).

    On a clean exit the file is fsynced, given the usual mode and renamed to ``path``; on an
    error it is removed and ``path`` is left as it was.

    Example::

        with atomic_output("run/final.weights.h5") as tmp:
            model.save_weights(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp{''.join(path.suffixes)}")
    try:
        yield tmp
        if tmp.exists():
            umask = os.umask(0o022)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Writes ``data`` (UTF-8 text or bytes) to ``path`` atomically; creates parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
