"""The crash-safety helpers of pipeline/fileio.py and export/fileio.py: locks, leftovers, faults.

Fast: the other processes here import only the fileio module (no TensorFlow).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from aiayn.export import fileio as export_fileio
from aiayn.pipeline import fileio
from aiayn.pipeline.errors import UserInputError

MODULES = [fileio, export_fileio]


def _holder(module, lock_path):
    """A child process that holds the lock until killed (prints 'held' once it does)."""
    code = textwrap.dedent(f"""
        import sys, time
        from {module.__name__} import hold_lock
        with hold_lock({str(lock_path)!r}, "the test directory"):
            print("held", flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("module", MODULES, ids=["pipeline", "export"])
def test_a_held_lock_names_its_holder_and_a_dead_holders_lock_is_taken_over(module, tmp_path):
    lock_path = tmp_path / "train.lock"
    proc = _holder(module, lock_path)
    try:
        with pytest.raises(module.LockHeld) as err:
            with module.hold_lock(lock_path, "The run directory x"):
                pass
        message = str(err.value)
        assert f"The run directory x is in use by pid {proc.pid} on host " in message
        assert "(command: " in message and "-c" in message and " since " in message
        assert err.value.holder["pid"] == proc.pid
        if module is fileio:
            assert isinstance(err.value, UserInputError)  # the CLI: one line, exit 2
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    with module.hold_lock(lock_path, "x") as info:  # the kernel dropped the dead holder's lock
        assert info["pid"] == os.getpid()
        assert info["previous"]["pid"] == proc.pid  # it died holding it
        assert str(os.getpid()) in lock_path.read_text()
    assert lock_path.read_text() == ""  # a clean release leaves no holder
    with module.hold_lock(lock_path, "x") as info:
        assert info["previous"] is None


def test_pipeline_fileio_is_export_fileio_with_a_user_facing_lock_error(tmp_path):
    for name in ("atomic_output", "atomic_write", "describe_holder", "fault_point", "fsync_dir",
                 "leftover_target", "remove_leftovers"):
        assert getattr(fileio, name) is getattr(export_fileio, name), name
    assert issubclass(fileio.LockHeld, export_fileio.LockHeld)
    assert issubclass(fileio.LockHeld, UserInputError)
    assert not issubclass(export_fileio.LockHeld, UserInputError)
    with fileio.hold_lock(tmp_path / "a.lock", "x") as info:  # the pipeline's wrapper holds it
        assert info["pid"] == os.getpid() and str(os.getpid()) in (tmp_path / "a.lock").read_text()


def test_waiting_for_a_lock_says_who_holds_it_then_times_out(tmp_path):
    lock_path = tmp_path / ".export.lock"
    proc = _holder(export_fileio, lock_path)
    lines = []
    try:
        with pytest.raises(export_fileio.LockHeld, match=f"pid {proc.pid}"):
            with export_fileio.hold_lock(lock_path, "the export base", wait_s=0.5,
                                         on_wait=lines.append):
                pass
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert len(lines) == 1 and lines[0].startswith("waiting for the export base, in use by pid")


@pytest.mark.parametrize("module", MODULES, ids=["pipeline", "export"])
def test_remove_leftovers_deletes_only_temporaries_of_atomic_writes(module, tmp_path):
    keep = ["history.json", "ckpt-00000004.weights.h5", ".hidden", "x.tmp", ".a.b.tmp"]
    leftovers = [".history.json.0123456789ab.tmp",
                 ".ckpt-00000004.weights.h5.abcdef012345.tmp.weights.h5"]
    for name in keep + leftovers:
        (tmp_path / name).write_text("x")
    assert module.leftover_target(leftovers[1]) == "ckpt-00000004.weights.h5"
    assert module.remove_leftovers(tmp_path, names={"best.weights.h5"}) == []
    removed = module.remove_leftovers(tmp_path)
    assert sorted(p.name for p in removed) == sorted(leftovers)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)


@pytest.mark.parametrize("module", MODULES, ids=["pipeline", "export"])
def test_fault_point_kills_at_the_nth_matching_write(module, tmp_path):
    code = textwrap.dedent(f"""
        from {module.__name__} import atomic_output, atomic_write
        atomic_write({str(tmp_path / "a.json")!r}, "1")
        atomic_write({str(tmp_path / "b.json")!r}, "b")
        with atomic_output({str(tmp_path / "a.json")!r}) as tmp:
            tmp.write_text("2")
        print("not reached", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "AIAYN_FAULT": "write:a.*@2"}, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "not reached" not in proc.stdout
    assert (tmp_path / "a.json").read_text() == "1"  # the old file, whole
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [module.leftover_target(n) for n in names] == ["a.json", None, None]
