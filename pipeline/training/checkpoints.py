"""Step checkpoints and the resumable backup: what a killed run restarts from.

    checkpoints/ckpt-<step:08d>.weights.h5   model weights every N steps, the last K kept
    backup/                                  keras BackupAndRestore state (+ RNG and clock state)

Steps are optimizer updates (``optimizer.iterations``), as everywhere in training.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import keras
import numpy as np

from aiayn.pipeline.fileio import atomic_write
from aiayn.pipeline.training.artifacts import list_checkpoints, save_model_weights
from aiayn.pipeline.training.callbacks import TrainingClock, current_step


class StepCheckpoints(keras.callbacks.Callback):
    """Saves the model weights every ``every`` optimizer steps, keeping the newest ``keep``.

    Files: ``<directory>/ckpt-<step:08d>.weights.h5`` (model only; see
    :func:`save_model_weights`), written atomically. Also saves at the end of training so the
    final step is always a checkpoint.
    """

    def __init__(self, directory: str | os.PathLike, every: int, keep: int,
                 write: bool = True):
        super().__init__()
        self.directory = Path(directory)
        self.every = max(1, int(every))
        self.keep = max(1, int(keep))
        self.write = write
        self._last_saved = -1

    def _save(self, step: int) -> None:
        if step == self._last_saved or step <= 0:
            return
        self._last_saved = step
        if not self.write:
            return
        save_model_weights(self.model, self.directory / f"ckpt-{step:08d}.weights.h5")
        for _, old in list_checkpoints(self.directory)[:-self.keep]:
            old.unlink(missing_ok=True)

    def on_train_begin(self, logs=None):
        self._last_saved = current_step(self.model)

    def on_train_batch_end(self, batch, logs=None):
        step = current_step(self.model)
        if step % self.every == 0:
            self._save(step)

    def on_train_end(self, logs=None):
        self._save(current_step(self.model))


def _seed_generator_states(model: keras.Model) -> list:
    return [v for v in model.variables if v.path.endswith("seed_generator_state")]


class ResumableBackup(keras.callbacks.BackupAndRestore):
    """``keras.callbacks.BackupAndRestore`` plus what exact resumption also needs.

    Keras backs up the model and optimizer (so the schedule step, ``optimizer.iterations``) at
    each epoch end and restores the epoch. This subclass also keeps the dropout RNG state (Keras
    seed generators are not part of ``save_weights``) and the training clock (seconds trained
    so far, for the time budget). It does not back up an epoch cut short by a stop request
    (time budget, NaN, early stopping): that state is not an epoch boundary. The data position
    is restored by the caller, which skips the batches already consumed (see
    :func:`restored_epoch`).
    """

    def __init__(self, backup_dir: str | os.PathLike, clock: "TrainingClock | None" = None):
        super().__init__(str(backup_dir), save_freq="epoch", double_checkpoint=True,
                         delete_checkpoint=False)
        self.clock = clock
        self._extra_path = Path(backup_dir) / "extra_state.npz"

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._extra_path.exists() and Path(self._weights_path).exists():
            with np.load(self._extra_path) as data:
                states = _seed_generator_states(self.model)
                if int(data["num_rng"]) == len(states):
                    for i, v in enumerate(states):
                        v.assign(data[f"rng_{i}"])
                if self.clock is not None:
                    self.clock.restore(float(data["elapsed_s"]))

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training:
            return
        super().on_epoch_end(epoch, logs)
        arrays = {f"rng_{i}": keras.ops.convert_to_numpy(v)
                  for i, v in enumerate(_seed_generator_states(self.model))}
        arrays["num_rng"] = np.array(len(arrays))
        arrays["elapsed_s"] = np.array(self.clock.elapsed() if self.clock else 0.0)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        atomic_write(self._extra_path, buffer.getvalue())


def restored_epoch(backup_dir: str | os.PathLike) -> int:
    """The epoch that ``BackupAndRestore`` will resume from (0 without a backup)."""
    meta = Path(backup_dir) / "training_metadata.json"
    weights = Path(backup_dir) / "latest.weights.h5"
    for m, w in ((meta, weights), (Path(f"{meta}.bkp"), Path(f"{weights}.bkp"))):
        if m.exists() and w.exists():
            try:
                return int(json.loads(m.read_text())["epoch"])
            except (ValueError, KeyError):
                continue
    return 0
