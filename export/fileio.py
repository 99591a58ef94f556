"""Atomic file writes and directory locks for export/.

Atomic writes: a temporary file in the same directory, fsync, then a rename (and an fsync of the
directory). A reader (a watching server, a resumed run, a user's `cat`) sees the old file or the
new one, never half of one; an interrupted write leaves at most a ``.<name>.<12 hex>.tmp[...]``
file, never a partial ``<name>``, and :func:`remove_leftovers` deletes those once their writer
is known to be dead. Files get the usual mode (0666 minus the umask, 0644 by default), not
``mkstemp``'s 0600.

Locks: :func:`hold_lock` takes an exclusive ``fcntl.flock`` on a lock file and writes who holds
it (pid, host, start time, command) into it. The kernel releases the lock when its holder dies,
however it dies (SIGKILL included), so a stale lock is simply taken over; a live holder gets a
:class:`LockHeld` error naming it.

Fault injection (tests only): ``AIAYN_FAULT=<glob>[@<n>]`` makes the process SIGKILL itself the
n-th time (default 1) it reaches a fault point whose name matches ``<glob>``. The atomic writers
reach ``write:<file name>`` when the temporary file is complete, just before the rename (the
moment a kill leaves a leftover and the old file); other points are named where they are called.
Unset (always, outside tests), a fault point costs one environment lookup.

This is the one implementation: ``aiayn.pipeline.fileio`` re-exports it (pipeline/ may import
export/, not the reverse), with a held lock reported as the user's error.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import fnmatch
import json
import os
import re
import shlex
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

_TMP_NAME = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{12}\.tmp(?:\..+)?$")
_FAULT_HITS: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Test hook: SIGKILLs this process at the n-th point matching ``$AIAYN_FAULT``."""
    spec = os.environ.get("AIAYN_FAULT")
    if not spec:
        return
    pattern, _, nth = spec.partition("@")
    if fnmatch.fnmatchcase(name, pattern):
        _FAULT_HITS[pattern] = _FAULT_HITS.get(pattern, 0) + 1
        if _FAULT_HITS[pattern] == int(nth or 1):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def fsync_dir(directory: Path) -> None:
    """fsyncs a directory (makes a rename in it durable); a no-op where that is impossible."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a directory
        pass
    finally:
        os.close(fd)


def _tmp_path(path: Path, suffixes: str = "") -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp{suffixes}")


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
    tmp = _tmp_path(path, "".join(path.suffixes))
    try:
        yield tmp
        if tmp.exists():  # created by the writer itself: the usual mode (0666 minus the umask)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            fault_point(f"write:{path.name}")
            os.replace(tmp, path)
            fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Writes ``data`` (UTF-8 text or bytes) to ``path`` atomically; creates parent folders."""
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def leftover_target(path: str | os.PathLike) -> str | None:
    """The file name an atomic writer's temporary ``path`` was for (None: not a temporary)."""
    match = _TMP_NAME.match(Path(path).name)
    return match.group("name") if match else None


def remove_leftovers(directory: str | os.PathLike,
                     names: Iterable[str] | None = None) -> list[Path]:
    """Deletes the temporaries of interrupted atomic writes in ``directory`` (not recursive).

    Only call this where no live process can be writing them (e.g. under the directory's
    :func:`hold_lock`). ``names``: only temporaries of these target file names.
    """
    directory = Path(directory)
    wanted = set(names) if names is not None else None
    removed = []
    if not directory.is_dir():
        return removed
    for p in directory.iterdir():
        target = leftover_target(p)
        if target is not None and (wanted is None or target in wanted) and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


# -- locks -------------------------------------------------------------------------------------
class LockHeld(RuntimeError):
    """Another live process holds the lock; ``holder`` is what it wrote (may be empty)."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


def describe_holder(holder: dict) -> str:
    """``pid 123 on host h since 2025-01-01T10:00:00+00:00 (command: aiayn train ...)``."""
    if not holder:
        return "another process (it has not written its details yet)"
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since "
            f"{holder.get('started', '?')} (command: {holder.get('command', '?')})")


def _read_holder(fd: int) -> dict:
    try:
        raw = os.pread(fd, 65536, 0)
        holder = json.loads(raw.decode("utf-8")) if raw.strip() else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def hold_lock(path: str | os.PathLike, what: str, wait_s: float = 0.0,
              on_wait: Callable[[str], None] | None = None,
              error: type[LockHeld] = LockHeld) -> Iterator[dict]:
    """Holds an exclusive lock on the file ``path`` for the ``with`` block.

    The holder's pid, host, start time and command are written into the file while it is held
    (and cleared on release). A lock whose holder died is free again (the kernel drops a flock
    with its last descriptor): it is taken over, and the block receives the dead holder's
    details as ``previous`` in the yielded dict.

    Args:
      path: the lock file (created; never deleted, which would let two processes lock two
        different files of the same name).
      what: what the lock protects, for the message (``"the export base exports/"``).
      wait_s: how long to wait for a live holder before giving up (0: do not wait).
      on_wait: called once with a line naming the holder when waiting starts.
      error: the :class:`LockHeld` subclass to raise (pipeline/'s is a user input error).

    Raises:
      LockHeld: a live process still holds it after ``wait_s``; the message names it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _read_holder(fd)
                if time.monotonic() >= deadline:
                    raise error(
                        f"{what} is in use by {describe_holder(holder)}; wait for it to finish "
                        f"or stop it, then try again (lock file {path}; a lock left by a "
                        "process that died is taken over automatically).", holder) from None
                if on_wait is not None:
                    on_wait(f"waiting for {what}, in use by {describe_holder(holder)}")
                    on_wait = None
                time.sleep(0.2)
            except OSError as err:  # a file system without locks (some network or FUSE mounts)
                print(f"warning: cannot lock {path} ({err.strerror or err}): nothing keeps a "
                      f"second process from using {what} at the same time.", file=sys.stderr)
                break
        previous = _read_holder(fd)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                "command": shlex.join(sys.argv) if sys.argv else "?"}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
        try:
            yield {**info, "previous": previous or None}
        finally:
            os.ftruncate(fd, 0)  # released cleanly: nobody to name
    finally:
        os.close(fd)  # drops the flock


_VERSION_RE = re.compile(r"^[0-9]+$")


def list_versions(model_dir: str | os.PathLike) -> list[int]:
    """Integer version directories under a model directory (``<base_dir>/<model_name>``, the
    layout TF Serving watches; CTranslate2 exports use the same), ascending."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir()
                  if p.is_dir() and _VERSION_RE.match(p.name))
