"""Fault injection: kills at random moments and inside writes, a NaN loss, concurrent runs (slow).

The run under test is the `tiny` preset on the conftest toy corpus (train split only, so no dev
scoring), 24 steps of 3-step epochs, float32 with deterministic ops, in real subprocesses, as in
tests/test_train_reliability.py. One run directory goes through a chain of attempts, each ended
differently: SIGTERM and SIGKILL at random moments (seeded; set ``AIAYN_FAULT_SEED`` to try
another seed), and SIGKILL inside a checkpoint write, between the backup's weights and metadata,
and inside the final weights' write (``AIAYN_FAULT``, see
pipeline/fileio.py). Then the same command once more: it completes with exactly the weights of
an uninterrupted run. Also: a NaN loss under mixed_float16, a killed export, concurrent exports.
The whole file takes about 3 minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.weights_helpers import assert_same_weights, read_weights

keras = pytest.importorskip("keras")

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("AIAYN_FAULT_SEED", "20240611"))

TRAIN_SCRIPT = r'''
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
from aiayn.pipeline.config import load_config
from aiayn.pipeline.training.train import train

run_dir, overrides = sys.argv[1], sys.argv[2:]
cfg = load_config(["tiny"], [f"train.run_dir={run_dir}"] + overrides)
delay = float(os.environ.get("AIAYN_TEST_BATCH_DELAY", "0"))

class Slow(keras.callbacks.Callback):  # numerics untouched: room to kill mid-training
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(delay)

summary = train(cfg, extra_callbacks=[Slow()])
print("SUMMARY " + json.dumps({k: summary[k] for k in ("steps", "end_state")}), flush=True)
'''

STEPS = 24  # 8 epochs: room for every kill of the chain to find an epoch end still to do


def _env(**extra):
    env = dict(os.environ)
    for name in ("TF_CONFIG", "AIAYN_FAULT"):
        env.pop(name, None)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", **extra})
    return env


@pytest.fixture(scope="module")
def fault_data(spm_model_path, tmp_path_factory):
    """The toy corpus' train split and vocabulary, without a dev split (no dev scoring)."""
    data_dir = tmp_path_factory.mktemp("fault_data")
    for name in ("train.tsv", "spm.model"):
        shutil.copy(Path(spm_model_path).parent / name, data_dir / name)
    return data_dir


def _overrides(data_dir, **extra):
    values = {"data.data_dir": data_dir, "data.vocab_size": 200, "train.steps": STEPS,
              "train.steps_per_epoch": 3, "train.checkpoint_every": 4,
              "train.keep_checkpoints": 2, "train.average_last": 2, "train.eval_every": 0,
              "train.deterministic": "true", "train.distribute": "default",
              "train.mixed_precision": "float32", **extra}
    return [f"{k}={v}" for k, v in values.items()]


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("fault_script") / "train_script.py"
    path.write_text(TRAIN_SCRIPT)
    return path


class Attempt:
    """One `python train_script.py RUN_DIR ...` process; its output is collected as it comes."""

    def __init__(self, script, run_dir, overrides, **env):
        self.proc = subprocess.Popen([sys.executable, str(script), str(run_dir), *overrides],
                                     env=_env(**env), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.training = threading.Event()  # the first step is done
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("step "):
                self.training.set()
        self.training.set()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout=300) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(10)
        self.proc.stdout.close()
        return code

    def kill_at_random(self, rng, within_s):
        assert self.training.wait(240), self.output[-3000:]
        time.sleep(rng.uniform(0.0, within_s))
        assert self.proc.poll() is None, "finished before the kill:\n" + self.output[-3000:]
        os.kill(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def reference(script, fault_data, tmp_path_factory):
    """An uninterrupted run of the same configuration."""
    run_dir = tmp_path_factory.mktemp("fault_reference") / "run"
    attempt = Attempt(script, run_dir, _overrides(fault_data))
    assert attempt.wait() == 0, attempt.output[-3000:]
    assert f'"steps": {STEPS}' in attempt.output
    return run_dir


def _backup_epoch(run_dir) -> int:
    try:
        return int(json.loads((run_dir / "backup" / "training_metadata.json").read_text())
                   ["epoch"])
    except (OSError, ValueError, KeyError):
        return 0


def _temporaries(run_dir):
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if ".tmp" in p.name)


def _train_state(run_dir) -> dict:
    return json.loads((run_dir / "train_state.json").read_text())


def _refused_rerun(run_dir, capsys) -> str:
    """`aiayn train` on the run directory once more: exit 2; returns its stderr, stripped."""
    from aiayn.pipeline import cli

    assert cli.main(["train", "--preset", "tiny", "--set", f"train.run_dir={run_dir}"]) == 2
    return capsys.readouterr().err.strip()


def _wait_for_a_backup(attempt: Attempt, run_dir) -> None:
    """Polls until the attempt, still running, has written its first epoch's backup."""
    deadline = time.monotonic() + 240
    while _backup_epoch(run_dir) < 1:
        assert attempt.proc.poll() is None and time.monotonic() < deadline, \
            attempt.output[-3000:]
        time.sleep(0.05)


def _assert_the_run_dir_is_taken_by(pid: int, run_dir, capsys) -> None:
    """Both the lock itself and a second `aiayn train` refuse the directory, naming `pid`."""
    from aiayn.pipeline.fileio import LockHeld, hold_lock

    with pytest.raises(LockHeld, match=f"in use by pid {pid} on host"):
        with hold_lock(run_dir / "train.lock", "x"):
            pass
    err = _refused_rerun(run_dir, capsys)
    assert len(err.splitlines()) == 1 and f"pid {pid}" in err, err


def _assert_interrupted_with_a_backup(output: str, run_dir) -> None:
    assert "training interrupted (SIGTERM)" in output, output[-3000:]
    state = _train_state(run_dir)
    assert state["status"] == state["summary"]["end_state"] == "interrupted"
    assert state["summary"]["resume_from_step"] >= 3 and _backup_epoch(run_dir) >= 1


# Attempts 2-5 of the chain: (kind, AIAYN_FAULT) or ("random", kill within seconds). The
# metadata fault follows an attempt that leaves the backup whole (killed in a checkpoint write):
# after a random kill, the start-up repair may itself write training_metadata.json (copying the
# .bkp state back) and take the fault there instead.
KILLS = [("fault", "write:ckpt-*.weights.h5@1"), ("fault", "write:training_metadata.json@1"),
         ("random", 1.0), ("fault", "write:final.weights.h5@1")]


def _run_until_killed(script, run_dir, overrides, rng, kind, arg) -> str:
    """One attempt of the chain, ended by SIGKILL (a fault point or a random moment); its
    output."""
    if kind == "fault":
        attempt = Attempt(script, run_dir, overrides, AIAYN_FAULT=arg)
    else:
        attempt = Attempt(script, run_dir, overrides, AIAYN_TEST_BATCH_DELAY="0.1")
        attempt.kill_at_random(rng, arg)
    code = attempt.wait()
    assert code == -signal.SIGKILL, f"{kind} {arg}: exit {code}\n" + attempt.output[-3000:]
    return attempt.output


def _assert_left_half_written(arg, run_dir) -> None:
    """What a kill inside the write `arg` names leaves behind, for the next attempt to repair."""
    from aiayn.pipeline.training.checkpoints import check_state

    if arg == "write:ckpt-*.weights.h5@1":
        assert [t for t in _temporaries(run_dir) if t.startswith("checkpoints/")]
    if arg == "write:training_metadata.json@1":  # new weights, old metadata
        assert check_state(run_dir / "backup")[0] is None
        assert check_state(run_dir / "backup", ".bkp")[0] is not None
    if arg == "write:final.weights.h5@1":
        assert not (run_dir / "final.weights.h5").exists() and _temporaries(run_dir)


def _assert_same_run_as(reference, run_dir) -> None:
    """The same weights, checkpoints and history as the uninterrupted run; no leftovers."""
    assert_same_weights(reference / "checkpoints" / f"ckpt-{STEPS:08d}.weights.h5",
                        run_dir / "checkpoints" / f"ckpt-{STEPS:08d}.weights.h5")
    assert_same_weights(reference / "final.weights.h5", run_dir / "final.weights.h5")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == \
        sorted(p.name for p in (reference / "checkpoints").iterdir())
    assert _temporaries(run_dir) == [] and not (run_dir / "backup").exists()
    steps = [r["step"] for r in json.loads((run_dir / "history.json").read_text())["rows"]]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS
    assert _train_state(run_dir)["status"] == "complete"


def test_killed_anywhere_the_same_command_still_ends_with_the_uninterrupted_weights(
        script, fault_data, reference, tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = _overrides(fault_data)
    rng = random.Random(SEED)
    print(f"AIAYN_FAULT_SEED={SEED}")

    # 1. SIGTERM after the first backup: recorded as interrupted, the backup kept. While it
    #    runs, a second run on the directory is refused, naming it.
    first = Attempt(script, run_dir, overrides, AIAYN_TEST_BATCH_DELAY="0.3")
    _wait_for_a_backup(first, run_dir)
    _assert_the_run_dir_is_taken_by(first.proc.pid, run_dir, capsys)
    time.sleep(rng.uniform(0.0, 0.5))
    os.kill(first.proc.pid, signal.SIGTERM)
    assert first.wait() != 0
    _assert_interrupted_with_a_backup(first.output, run_dir)

    # 2-5: each killed differently (KILLS); each resumes from what the previous one left.
    outputs = []
    for kind, arg in KILLS:
        outputs.append(_run_until_killed(script, run_dir, overrides, rng, kind, arg))
        _assert_left_half_written(arg, run_dir)
    assert "resuming from step" in outputs[0]
    assert "taking over the lock of pid" in outputs[1]  # the first SIGKILL left it
    assert "resuming from the previous one" in outputs[2]  # the backup fell back to .bkp

    # The same command again: complete, and exactly the uninterrupted run's weights.
    last = Attempt(script, run_dir, overrides)
    assert last.wait() == 0, last.output[-3000:]
    assert f'"steps": {STEPS}, "end_state": "complete"' in last.output
    _assert_same_run_as(reference, run_dir)


# ---------------------------------------------------------------------------------------------
# A NaN loss under mixed_float16 (in this process)


class _NanLossAt(keras.callbacks.Callback):
    """Makes the loss of batch ``at`` (0-based) NaN: the first trainable variable is NaN during
    that batch only. The loss-scale optimizer then skips the update, so the weights stay
    finite: only the loss shows the divergence."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.seen, self.saved = at, 0, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.seen == self.at:
            variable = self.model.trainable_weights[0]
            self.saved = keras.ops.convert_to_numpy(variable)
            variable.assign(np.full_like(self.saved, np.nan))

    def on_train_batch_end(self, batch, logs=None):
        if self.seen == self.at:
            self.model.trainable_weights[0].assign(self.saved)
        self.seen += 1


@pytest.fixture
def restore_policy():
    policy = keras.mixed_precision.global_policy().name
    yield
    keras.mixed_precision.set_global_policy(policy)


def _nan_config(fault_data, run_dir):
    """Checkpoints every 2 steps, so that step 4's is the last good one before step 5's NaN."""
    from aiayn.pipeline.config import load_config

    return load_config(["tiny"], [f"train.run_dir={run_dir}"] + _overrides(
        fault_data, **{"train.steps": 9, "train.mixed_precision": "mixed_float16",
                       "train.checkpoint_every": 2,
                       "train.deterministic": "false"}))


def _assert_recorded_as_diverged_at_step_5(run_dir, ckpt4) -> None:
    state = _train_state(run_dir)
    summary = state["summary"]
    assert state["status"] == summary["end_state"] == "diverged"
    assert summary["stop_reason"] == "nan" and summary["mixed_precision"] == "mixed_float16"
    assert summary["diverged_at_step"] == 5 and summary["last_good_step"] == 4
    assert summary["last_good_checkpoint"] == str(ckpt4) and summary["resume_from_step"] == 3


def _assert_nothing_kept_from_step_5_on(run_dir, ckpt4) -> None:
    """No checkpoint after it, no final weights, no backup of its epoch; the weights kept are
    finite."""
    from aiayn.pipeline.training.artifacts import list_checkpoints
    from aiayn.pipeline.training.checkpoints import restored_epoch

    assert [s for s, _ in list_checkpoints(run_dir / "checkpoints")] == [2, 4]
    assert not (run_dir / "final.weights.h5").exists()
    assert restored_epoch(run_dir / "backup") == 1
    assert all(np.isfinite(v).all() for v in read_weights(ckpt4).values()
               if np.issubdtype(np.asarray(v).dtype, np.floating))


def test_a_nan_loss_under_mixed_float16_ends_diverged_and_keeps_the_good_checkpoints(
        fault_data, tmp_path, capsys, restore_policy):
    from aiayn.pipeline.errors import UserInputError
    from aiayn.pipeline.training.train import train

    run_dir = tmp_path / "run"
    cfg = _nan_config(fault_data, run_dir)
    with pytest.raises(UserInputError) as err:
        train(cfg, extra_callbacks=[_NanLossAt(4)])  # batch 4: step 5's loss
    message = str(err.value)
    ckpt4 = run_dir / "checkpoints" / "ckpt-00000004.weights.h5"
    assert message.startswith("Training diverged: the loss was nan at step 5")
    assert f"The last good checkpoint is {ckpt4} (step 4" in message
    assert "fresh train.run_dir" in message and "train.learning_rate_scale" in message
    _assert_recorded_as_diverged_at_step_5(run_dir, ckpt4)
    _assert_nothing_kept_from_step_5_on(run_dir, ckpt4)

    # A re-run does not return quietly: one line, exit 2, what to do.
    capsys.readouterr()
    line = _refused_rerun(run_dir, capsys)
    assert len(line.splitlines()) == 1 and "diverged (non-finite loss at step 5)" in line
    assert str(ckpt4) in line

    # The advice works: without train_state.json the run continues from its last good backup.
    (run_dir / "train_state.json").unlink()
    summary = train(cfg)
    assert summary["end_state"] == "complete" and summary["steps"] == 9
    assert "resuming from step 3" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Exports: a killed export, two exports at once


EXPORT_SCRIPT = r'''
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from aiayn.pipeline.config import load_config
from aiayn.pipeline.release.export_run import export_run
cfg = load_config(["tiny"], sys.argv[1:])
print("EXPORTED", export_run(cfg, verify=False), flush=True)
'''


def test_a_killed_export_leaves_nothing_and_the_next_export_takes_its_version(
        reference, fault_data, tmp_path):
    from aiayn.export import saved_model as sm

    base = tmp_path / "exports"
    overrides = [f"train.run_dir={reference}", f"data.data_dir={fault_data}",
                 "data.vocab_size=200", f"export.base_dir={base}", "export.model_name=tr",
                 "decode.beam_size=1", "decode.n_best=1"]  # greedy: a quicker trace
    script = tmp_path / "export_script.py"
    script.write_text(EXPORT_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), *overrides], capture_output=True,
                          text=True, timeout=300,
                          env=_env(AIAYN_FAULT="export:before_rename"))
    assert proc.returncode == -signal.SIGKILL, proc.stdout[-2000:] + proc.stderr[-2000:]
    model_dir = base / "tr"
    leftovers = [p for p in model_dir.iterdir() if p.name.startswith(".tmp-1-")]
    assert len(leftovers) == 1 and (leftovers[0] / "saved_model.pb").exists()
    assert sm.list_versions(model_dir) == []  # written in full, never published
    assert (base / sm.EXPORT_LOCK).exists()

    # The next export (export_saved_model's own numbering and publishing; a full export runs in
    # tests/export/test_saved_model.py) removes the dead one's directory and takes version 1.
    with sm._new_version(base, "tr", 0) as (version, tmp):
        assert version == 1 and not leftovers[0].exists()
        tmp.mkdir()
        (tmp / "saved_model.pb").write_text("x")
    assert [p.name for p in model_dir.iterdir()] == ["1"]
    assert (base / sm.EXPORT_LOCK).read_text() == ""


def test_two_exports_at_once_get_two_versions(tmp_path, capfd):
    from aiayn.export import saved_model as sm

    base, inside, versions, errors = tmp_path / "exports", threading.Event(), [], []

    def export(name, hold_s):
        try:
            with sm._new_version(base, "tr", 0) as (version, tmp):
                tmp.mkdir()
                (tmp / "saved_model.pb").write_text(name)
                inside.set()
                time.sleep(hold_s)
            versions.append((name, version))
        except Exception as err:  # surfaced below
            errors.append(err)

    first = threading.Thread(target=export, args=("first", 1.0))
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=export, args=("second", 0.0))
    second.start()
    first.join(30)
    second.join(30)
    assert not errors and sorted(versions) == [("first", 1), ("second", 2)]
    assert (base / "tr" / "2" / "saved_model.pb").read_text() == "second"
    assert f"waiting for the export base {base}, in use by pid {os.getpid()}" in \
        capfd.readouterr().err
    with sm._new_version(base, "tr", 0, lock_wait_s=5) as (version, tmp):
        with pytest.raises(sm.ExportError, match=f"in use by pid {os.getpid()}"):
            with sm._new_version(base, "tr", 0, lock_wait_s=0):
                pass
        tmp.mkdir()
    assert sm.list_versions(base / "tr") == [1, 2, 3]
