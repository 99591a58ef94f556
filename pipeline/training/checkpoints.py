"""Step checkpoints and the resumable backup: what a killed run restarts from.

    checkpoints/ckpt-<step:08d>.weights.h5   model weights every N steps, the last K kept
    checkpoints/ema-<step:08d>.weights.h5    the weights' moving average at the last step (with
                                             ``train.ema_momentum``: the optimizer's EMA)
    backup/                                  the resumable state at the last epoch boundary

Steps are optimizer updates (``optimizer.iterations``), as everywhere in training.

The backup keeps Keras ``BackupAndRestore``'s layout (Keras restores from it) but writes it
crash-safely. One *state* is three files that carry the same random ``backup_id``:

    latest.weights.h5        model and optimizer (``model.save_weights``); the id is an HDF5
                             attribute of the file's root
    extra_state.npz          dropout RNG state and the training clock (Keras keeps neither)
    training_metadata.json   {"epoch": E, "batch": 0, "backup_id": ...}; Keras reads "epoch"
    *.bkp                    the previous state: the same three files

Saving copies the current state to ``*.bkp`` and then writes the new one, each file atomically
(temporary file, fsync, rename) and the metadata last. So whenever the process dies (SIGKILL
included), the latest state or the ``.bkp`` state is whole and consistent, and
:func:`prepare_backup`, on start, keeps the first of them that is: it checks that the metadata
parses, that the weights file opens as HDF5 and that the three ids agree. With neither, it
discards the backup with a note, and training starts again from step 0.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import h5py
import keras
import numpy as np

from aiayn.pipeline.fileio import atomic_output, atomic_write, remove_leftovers
from aiayn.pipeline.training.artifacts import (
    EMA_PATTERN,
    checkpoint_name,
    ema_name,
    list_checkpoints,
    save_model_weights,
)
from aiayn.pipeline.training.callbacks import TrainingClock, current_step

WEIGHTS, EXTRA, METADATA = "latest.weights.h5", "extra_state.npz", "training_metadata.json"
PREVIOUS = ".bkp"
_ID = "aiayn_backup_id"


class StepCheckpoints(keras.callbacks.Callback):
    """Saves the model weights every ``every`` optimizer steps, keeping the newest ``keep``.

    Files: ``<directory>/ckpt-<step:08d>.weights.h5`` (model only; see
    :func:`save_model_weights`), written atomically. Also saves at the end of training so the
    final step is always a checkpoint, and then, when the optimizer keeps a moving average of the
    weights, that average as ``ema-<step:08d>.weights.h5`` (the only one). Nothing is saved
    while ``skip_if()`` is true (a diverged or interrupted run: its weights are not to be kept).
    On start, the files of steps after the restored one (the lost future of a killed attempt)
    and temporaries of interrupted writes are removed.
    """

    def __init__(self, directory: str | os.PathLike, every: int, keep: int,
                 write: bool = True, skip_if: Callable[[], bool] | None = None):
        super().__init__()
        self.directory = Path(directory)
        self.every = max(1, int(every))
        self.keep = max(1, int(keep))
        self.write = write
        self.skip_if = skip_if
        self._last_saved = -1

    def _save(self, step: int) -> None:
        if step == self._last_saved or step <= 0:
            return
        if self.skip_if is not None and self.skip_if():
            return
        self._last_saved = step
        if not self.write:
            return
        save_model_weights(self.model, self.directory / checkpoint_name(step))
        for _, old in list_checkpoints(self.directory)[:-self.keep]:
            old.unlink(missing_ok=True)

    def _save_moving_average(self, step: int) -> None:
        if (not self.write or step <= 0 or moving_averages(self.model) is None
                or (self.skip_if is not None and self.skip_if())):
            return
        name = ema_name(step)
        save_moving_average(self.model, self.directory / name)
        for _, old in list_checkpoints(self.directory, EMA_PATTERN):
            if old.name != name:
                old.unlink(missing_ok=True)

    def on_train_begin(self, logs=None):
        self._last_saved = current_step(self.model)
        if self.write:
            remove_leftovers(self.directory)
            for step, path in (list_checkpoints(self.directory)
                               + list_checkpoints(self.directory, EMA_PATTERN)):
                if step > self._last_saved:
                    path.unlink(missing_ok=True)

    def on_train_batch_end(self, batch, logs=None):
        step = current_step(self.model)
        if step % self.every == 0:
            self._save(step)

    def on_train_end(self, logs=None):
        step = current_step(self.model)
        self._save(step)
        self._save_moving_average(step)


def moving_averages(model: keras.Model) -> list | None:
    """The optimizer's moving averages of ``model.trainable_variables`` (in their order), or
    ``None`` when it keeps none (``use_ema`` off, or not built yet)."""
    opt = getattr(model, "optimizer", None)
    opt = getattr(opt, "inner_optimizer", opt)  # a LossScaleOptimizer wraps the Adam
    if not getattr(opt, "use_ema", False):
        return None
    # Keras has no public accessor; its own finalize_variable_values reads the same list.
    averages = getattr(opt, "_model_variables_moving_average", None)
    if averages is None or len(averages) != len(model.trainable_variables):
        return None
    return averages


def save_moving_average(model: keras.Model, path: str | os.PathLike) -> Path:
    """Writes the weights' moving average as a weight file; the model keeps its own weights."""
    trained = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    try:
        for variable, average in zip(model.trainable_variables, moving_averages(model)):
            variable.assign(average)
        return save_model_weights(model, path)
    finally:
        for variable, value in zip(model.trainable_variables, trained):
            variable.assign(value)


def _seed_generator_states(model: keras.Model) -> list:
    return [v for v in model.variables if v.path.endswith("seed_generator_state")]


# -- the backup's files ------------------------------------------------------------------------
def _state(directory: Path, suffix: str = "") -> tuple[Path, Path, Path]:
    """(weights, extra, metadata) of the latest state (``""``) or the previous one (``.bkp``)."""
    return tuple(directory / f"{name}{suffix}" for name in (WEIGHTS, EXTRA, METADATA))


def _text(value) -> str | None:
    if value is None:
        return None
    value = np.asarray(value).item() if isinstance(value, np.ndarray) else value
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def check_state(directory: str | os.PathLike, suffix: str = "") -> tuple[int | None, str]:
    """``(epoch, "")`` when the state is whole and consistent, else ``(None, what is wrong)``.

    Whole: the metadata parses and names an epoch, the weights file opens as HDF5 (Keras writes
    it), and the ids of the three files agree. A state without ids (written by Keras itself)
    passes on the first two checks.
    """
    weights, extra, meta = _state(Path(directory), suffix)
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
        epoch = int(data["epoch"])
    except FileNotFoundError:
        return None, f"{meta.name} is missing"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return None, f"{meta.name} is unreadable ({type(err).__name__}: {err})"
    try:
        with h5py.File(weights, "r") as f:
            weights_id = _text(f.attrs.get(_ID))
            if not len(f.keys()):
                return None, f"{weights.name} holds no weights"
    except FileNotFoundError:
        return None, f"{weights.name} is missing"
    except OSError as err:
        return None, f"{weights.name} is not a readable HDF5 file ({' '.join(str(err).split())})"
    backup_id = data.get("backup_id")
    if backup_id is None:
        return epoch, ""
    if weights_id != backup_id:
        return None, f"{weights.name} and {meta.name} come from different saves"
    try:
        with np.load(extra) as arrays:
            extra_id = _text(arrays["backup_id"])
    except FileNotFoundError:
        return None, f"{extra.name} is missing"
    except Exception as err:  # a damaged zip raises many types (BadZipFile, EOFError, ...)
        return None, f"{extra.name} is unreadable ({type(err).__name__})"
    if extra_id != backup_id:
        return None, f"{extra.name} and {meta.name} come from different saves"
    return epoch, ""


def _copy_state(directory: Path, source_suffix: str, target_suffix: str) -> None:
    """Copies one state over the other, file by file, atomically, the metadata last."""
    for source, target in zip(_state(directory, source_suffix), _state(directory, target_suffix)):
        if source.exists():
            with atomic_output(target) as tmp:
                shutil.copyfile(source, tmp)


def prepare_backup(backup_dir: str | os.PathLike, stream=None) -> int:
    """Makes the backup's latest state whole before anything reads it; returns its epoch.

    Removes temporaries of interrupted writes; keeps the latest state if it is whole, else
    copies the previous (``.bkp``) state over it (with a note on ``stream``), else deletes the
    backup (with a note: training starts again from step 0). Idempotent.

    Returns:
      The epoch training resumes from (0: no usable backup).
    """
    directory = Path(backup_dir)
    if not directory.is_dir():
        return 0
    stream = stream or sys.stdout
    remove_leftovers(directory)
    epoch, why = check_state(directory)
    if epoch is not None:
        return epoch
    files = _state(directory) + _state(directory, PREVIOUS)
    if not any(p.exists() for p in files):
        return 0
    previous, why_previous = check_state(directory, PREVIOUS)
    if previous is not None:
        stream.write(f"backup {directory}: the latest state is unusable ({why}); resuming from "
                     f"the previous one (epoch {previous}).\n")
        _copy_state(directory, PREVIOUS, "")
        return previous
    stream.write(f"backup {directory}: no usable state (latest: {why}; previous: "
                 f"{why_previous}); discarded, training starts again from step 0.\n")
    stream.flush()
    shutil.rmtree(directory, ignore_errors=True)
    return 0


def restored_epoch(backup_dir: str | os.PathLike) -> int:
    """The epoch training resumes from: the latest whole state's, else the previous one's, else 0.

    Read-only (:func:`prepare_backup` makes that state the latest before Keras reads it).
    """
    for suffix in ("", PREVIOUS):
        epoch, _ = check_state(backup_dir, suffix)
        if epoch is not None:
            return epoch
    return 0


class ResumableBackup(keras.callbacks.BackupAndRestore):
    """``keras.callbacks.BackupAndRestore``, written crash-safely, plus what exact resumption
    also needs.

    Keras backs up the model and optimizer (so the schedule step, ``optimizer.iterations``) at
    each epoch end and restores the epoch. This subclass writes that state as described in the
    module docstring (Keras's own save overwrites the files in place), and also keeps the
    dropout RNG state (Keras seed generators are not part of ``save_weights``) and the training
    clock (seconds trained so far, for the time budget). On start it first repairs the backup
    (:func:`prepare_backup`), then lets Keras restore it. It does not back up an epoch cut short
    by a stop request (time budget, non-finite loss, early stopping, SIGTERM) nor anything while
    ``skip_if()`` is true: that state is not a good epoch boundary. The data position is restored
    by the caller, which skips the batches already consumed (see :func:`restored_epoch`).
    """

    def __init__(self, backup_dir: str | os.PathLike, clock: TrainingClock | None = None,
                 skip_if: Callable[[], bool] | None = None, stream=None):
        super().__init__(str(backup_dir), save_freq="epoch", double_checkpoint=True,
                         delete_checkpoint=False)
        self.clock = clock
        self.skip_if = skip_if
        self.stream = stream
        self._directory = Path(backup_dir)

    def on_train_begin(self, logs=None):
        prepare_backup(self._directory, self.stream)
        super().on_train_begin(logs)
        weights, extra, _ = _state(self._directory)
        if extra.exists() and weights.exists():
            with np.load(extra) as data:
                states = _seed_generator_states(self.model)
                if int(data["num_rng"]) == len(states):
                    for i, v in enumerate(states):
                        v.assign(data[f"rng_{i}"])
                if self.clock is not None:
                    self.clock.restore(float(data["elapsed_s"]))

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training or (self.skip_if is not None and self.skip_if()):
            return
        self._save_state(epoch + 1)

    def _save_state(self, epoch: int) -> None:
        directory = self._directory
        weights, extra, meta = _state(directory)
        if check_state(directory)[0] is not None:  # the current state becomes the previous one
            _copy_state(directory, "", PREVIOUS)
        backup_id = uuid.uuid4().hex
        with atomic_output(weights) as tmp:
            self.model.save_weights(str(tmp), overwrite=True)
            with h5py.File(tmp, "a") as f:
                f.attrs[_ID] = backup_id
        arrays = {f"rng_{i}": keras.ops.convert_to_numpy(v)
                  for i, v in enumerate(_seed_generator_states(self.model))}
        arrays["num_rng"] = np.array(len(arrays))
        arrays["elapsed_s"] = np.array(self.clock.elapsed() if self.clock else 0.0)
        arrays["backup_id"] = np.array(backup_id)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        atomic_write(extra, buffer.getvalue())
        atomic_write(meta, json.dumps({"epoch": epoch, "batch": 0, "backup_id": backup_id}))
