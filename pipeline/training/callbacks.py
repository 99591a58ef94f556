"""Training callbacks: budgets, divergence, SIGTERM, progress, history; the target-token metric.

Steps are optimizer updates (``optimizer.iterations``), which differ from ``model.fit`` batches
when gradients are accumulated; every callback here counts optimizer updates, so `train.steps`,
`checkpoint_every` and `eval_every` mean the paper's training steps.

Files written in the run directory (by the chief worker only; names in
:class:`~aiayn.pipeline.training.artifacts.RunFiles`): ``history.json``/``.csv`` (one row per
logged step / dev evaluation), ``tensorboard/`` (loss, learning rate, tokens/s, dev BLEU and
chrF). Step checkpoints and the resumable backup are in
:mod:`~aiayn.pipeline.training.checkpoints`; dev BLEU in :mod:`~aiayn.pipeline.training.dev_bleu`.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from aiayn.pipeline.fileio import atomic_output, atomic_write

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Small helpers


def current_step(model: keras.Model) -> int:
    """Optimizer updates done so far (accumulation-aware; LossScaleOptimizer-transparent)."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def current_learning_rate(model: keras.Model) -> float:
    opt = model.optimizer
    inner = getattr(opt, "inner_optimizer", opt)
    lr = inner.learning_rate
    return float(keras.ops.convert_to_numpy(lr))


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


# --------------------------------------------------------------------------------------------
# Metric: real target tokens


@keras.saving.register_keras_serializable(package="aiayn")
class TargetTokens(keras.metrics.Metric):
    """Counts real (non-padding) target tokens seen since the last reset.

    Used for tokens/s: the progress callback differentiates it between batches. Its variable
    sums across replicas, so the count is global.
    """

    def __init__(self, pad_id: int, name: str = "target_tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                       name="count", aggregation="sum")

    def update_state(self, y_true, y_pred=None, sample_weight=None):
        real = keras.ops.not_equal(y_true, self.pad_id)
        self.count.assign_add(keras.ops.sum(keras.ops.cast(real, "float32")))

    def result(self):
        return keras.ops.convert_to_tensor(self.count)

    def reset_state(self):
        self.count.assign(0.0)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


# --------------------------------------------------------------------------------------------
# Run history (history.json + history.csv), shared by the logging callbacks


class RunHistory:
    """Rows of metrics keyed by step, persisted as ``history.json`` and ``history.csv``.

    One row per logged step; dev evaluations merge into the row of their step. On resume,
    rows after the restored step are dropped (they belong to the lost future).
    """

    def __init__(self, run_dir: str | os.PathLike | None, write: bool = True):
        self.run_dir = Path(run_dir) if run_dir else None
        self.write = write and self.run_dir is not None
        self.rows: list[dict] = []
        if self.run_dir and (self.run_dir / "history.json").exists():
            try:
                self.rows = json.loads((self.run_dir / "history.json").read_text())["rows"]
            except (ValueError, KeyError):
                self.rows = []

    def truncate(self, step: int) -> None:
        self.rows = [r for r in self.rows if r["step"] <= step]

    def add(self, step: int, **metrics) -> None:
        clean = {k: (float(v) if isinstance(v, (np.floating, np.integer)) else v)
                 for k, v in metrics.items()}
        if self.rows and self.rows[-1]["step"] == step:
            self.rows[-1].update(clean)
        else:
            self.rows.append({"step": int(step), **clean})

    def save(self) -> None:
        if not self.write:
            return
        atomic_write(self.run_dir / "history.json",
                           json.dumps({"rows": self.rows}, indent=1))
        columns = ["step"]
        for row in self.rows:
            columns += [k for k in row if k not in columns]
        with atomic_output(self.run_dir / "history.csv") as tmp, \
                open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)


# --------------------------------------------------------------------------------------------
# Budgets and progress


class TrainingClock:
    """Seconds spent training across restarts (the time budget counts all attempts), and the
    time budget they count against: ``budget_seconds`` (0: none). The callbacks that end the
    run, decay the rate or switch dropout on by the clock all read the budget here, so a
    :class:`Deadline` that moves it early in the run moves them together."""

    def __init__(self, budget_minutes: float = 0.0):
        self._before = 0.0
        self._start = time.monotonic()
        self.budget_seconds = float(budget_minutes) * 60.0

    def restore(self, elapsed_before: float) -> None:
        self._before = float(elapsed_before)

    def start(self) -> None:
        self._start = time.monotonic()

    def elapsed(self) -> float:
        return self._before + time.monotonic() - self._start

    def share(self) -> float:
        """The spent share of the time budget (not capped at 1); 0 without a budget."""
        return self.elapsed() / self.budget_seconds if self.budget_seconds else 0.0


class Budget(keras.callbacks.Callback):
    """Stops training cleanly at ``max_steps`` optimizer steps or at the clock's time budget.

    The time budget counts the training clock (all attempts of this run). Stopping sets
    ``model.stop_training``; ``fit`` returns normally and the pipeline proceeds. ``reason``
    says why it stopped (``"steps"``, ``"time"`` or ``None``).
    """

    def __init__(self, max_steps: int, clock: TrainingClock | None = None):
        super().__init__()
        self.max_steps = int(max_steps)
        self.clock = clock or TrainingClock()
        self.reason: str | None = None

    def on_train_begin(self, logs=None):
        if current_step(self.model) >= self.max_steps:
            self.model.stop_training = True
            self.reason = "steps"

    def on_train_batch_end(self, batch, logs=None):
        if current_step(self.model) >= self.max_steps:
            self.reason = "steps"
            self.model.stop_training = True
        elif self.clock.budget_seconds and self.clock.share() >= 1.0:
            self.reason = "time"
            self.model.stop_training = True


class BudgetProgress(keras.callbacks.Callback):
    """Writes the share of the time budget spent into ``variable`` before each batch, so a
    learning rate that decays to zero at the budget's end (``models.schedule.BudgetSchedule``)
    knows where the run is. The clock counts all attempts of the run, so a resumed run
    continues the decay where it stopped."""

    def __init__(self, variable, clock: TrainingClock):
        super().__init__()
        self.variable = variable
        self.clock = clock

    def on_train_batch_begin(self, batch, logs=None):
        self.variable.assign(min(1.0, self.clock.share()))


class LateDropout(keras.callbacks.Callback):
    """Trains without dropout for the first ``share`` of the run, then at the model's rates.

    "Late dropout" (Liu et al., 2023, *Dropout Reduces Underfitting*): a model that would fit
    its data by the end of the run learns faster early without dropout and is regularised
    once it starts to fit. The run's share counts steps (``max_steps``) and, with a time
    budget, the training clock's share of it: whichever is further along, as the run ends at
    whichever comes first. Keras reads a ``Dropout``'s rate when it traces the train step, so each
    switch rebuilds ``model.train_function`` (one retrace). Every ``Dropout`` layer of the
    model with a rate above 0 is switched (``Layer._flatten_layers``, a private API:
    tests/test_keras_private_api.py); the rates are the model's again when ``fit`` ends.

    Attributes:
      enabled_at: the step at which dropout was switched on in this ``fit`` (``None``:
        still off, or on from the start because a resumed run was past the share).
    """

    def __init__(self, share: float, max_steps: int, clock: TrainingClock | None = None,
                 stream=None):
        super().__init__()
        self.share = float(share)
        self.max_steps = int(max_steps)
        self.clock = clock or TrainingClock()
        self.stream = stream or sys.stdout
        self.enabled_at: int | None = None
        self._rates: list[tuple[keras.layers.Dropout, float]] = []
        self._off = False

    def spent(self) -> float:
        """The share of the run done: of its steps, or of its time budget if further."""
        return max(current_step(self.model) / self.max_steps, self.clock.share())

    def on_train_begin(self, logs=None):
        self.enabled_at, self._off = None, False
        self._rates = [(layer, layer.rate) for layer in self.model._flatten_layers()
                       if isinstance(layer, keras.layers.Dropout) and layer.rate > 0]
        if self._rates and self.spent() < self.share:
            self._switch(off=True)

    def on_train_batch_begin(self, batch, logs=None):
        if self._off and self.spent() >= self.share:
            self._switch(off=False)
            self.enabled_at = current_step(self.model)
            rates = sorted({rate for _, rate in self._rates})
            self.stream.write(f"step {self.enabled_at}: dropout on ({', '.join(map(str, rates))}) "
                              f"after {self.share:g} of the run.\n")
            self.stream.flush()

    def on_train_end(self, logs=None):
        if self._off:  # a run that stopped before the switch: the next fit traces anew
            self._switch(off=False)

    def _switch(self, off: bool) -> None:
        for layer, rate in self._rates:
            layer.rate = 0.0 if off else rate
        self._off = off
        self.model.make_train_function(force=True)


class DivergenceGuard(keras.callbacks.TerminateOnNaN):
    """Stops training at the first non-finite (NaN or inf) loss and records where.

    It looks at the loss itself, so it works under every precision policy: with
    ``mixed_float16`` the loss-scale optimizer skips the update of a non-finite step and the
    weights stay finite, so NaN weights would never show it. Put it first among the callbacks:
    the writers after it (checkpoints, backup, dev evaluation) ask :attr:`diverged` and keep
    nothing from the bad step on.

    Attributes:
      step: the optimizer step whose loss was not finite (``None``: no divergence);
        ``last_finite_step`` = ``step - 1``, the last update computed from a finite loss.
      loss: that loss value.
    """

    def __init__(self, stream=None):
        super().__init__()
        self.stream = stream or sys.stdout
        self.step: int | None = None
        self.loss: float | None = None
        self._last_step = 0

    @property
    def diverged(self) -> bool:
        return self.step is not None

    def on_train_begin(self, logs=None):
        self.step, self.loss = None, None
        self._last_step = current_step(self.model)

    def on_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if self.step is not None or loss is None:
            return
        value = np.asarray(keras.ops.convert_to_numpy(loss), dtype="float64")
        if np.all(np.isfinite(value)):
            self._last_step = current_step(self.model)
            return
        # Float32 applied the bad update (NaN weights); a loss-scale optimizer skipped it. Either
        # way it was update number last_step + 1.
        self.step, self.loss = self._last_step + 1, float(value.ravel()[0])
        self.model.stop_training = True
        self.stream.write(f"non-finite loss ({self.loss}) at step {self.step}: training "
                          "stopped; nothing from this step on is saved.\n")
        self.stream.flush()


class SignalStop(keras.callbacks.Callback):
    """Turns a signal into a clean stop at the next batch end; ``received`` names it.

    ``handle`` is the signal handler (train() installs it for SIGTERM while ``fit`` runs);
    ``received`` may also be set by hand (``"SIGINT"`` after a KeyboardInterrupt).
    """

    def __init__(self):
        super().__init__()
        self.received: str | None = None

    def handle(self, signum, frame=None) -> None:
        self.received = signal.Signals(signum).name

    def on_train_batch_end(self, batch, logs=None):
        if self.received is not None:
            self.model.stop_training = True


def _accuracy(logs: dict) -> float | None:
    for key, value in logs.items():
        if "acc" in key:
            return float(value)
    return None


class ProgressLogger(keras.callbacks.Callback):
    """A progress line every ``every_s`` seconds, history rows and TensorBoard scalars.

    ``step 1200/20000 (6.0%) | loss 3.214 | acc 0.41 | lr 4.1e-04 | 5230 tok/s | 6m10s elapsed
    | ETA 29m00s``. The ETA is the sooner of the step budget and the time budget. Every
    ``log_every`` steps a history row (loss, accuracy, learning rate, tokens/s, total tokens)
    is recorded and written as TensorBoard scalars.
    """

    def __init__(self, total_steps: int, history: RunHistory, clock: TrainingClock,
                 log_every: int = 50, every_s: float = 30.0,
                 summary_dir: str | os.PathLike | None = None, stream=None, verbose: bool = True):
        super().__init__()
        self.total_steps = int(total_steps)
        self.history = history
        self.clock = clock
        self.log_every = max(1, int(log_every))
        self.every_s = float(every_s)
        self.summary_dir = summary_dir
        self.stream = stream or sys.stdout
        self.verbose = verbose
        self.writer = None
        self.tokens_total = 0.0
        self._epoch_tokens_last = 0.0
        self._window_tokens = 0.0
        self._window_start = time.monotonic()
        self._last_print = 0.0
        self._last_logged_step = -1
        self._loss_sum = 0.0
        self._window_loss, self._window_batches = 0.0, 0
        self.tokens_per_s = float("nan")
        self._rate_tokens = 0.0
        self._rate_time = 0.0

    def on_train_begin(self, logs=None):
        if self.summary_dir:
            self.writer = tf.summary.create_file_writer(str(self.summary_dir))
        self.start_step = current_step(self.model)
        self._session_start = time.monotonic()
        self._window_start = time.monotonic()
        if self.history.rows:
            self.tokens_total = float(self.history.rows[-1].get("tokens_total", 0.0))
        self._tokens_at_start = self.tokens_total

    @property
    def tokens_total_session(self) -> float:
        """Real target tokens trained on in this process (since ``fit`` began)."""
        return self.tokens_total - getattr(self, "_tokens_at_start", 0.0)

    def on_epoch_begin(self, epoch, logs=None):
        # Keras resets metrics each epoch: the token count and the running mean loss restart.
        self._epoch_tokens_last = 0.0
        self._loss_sum = 0.0
        self._window_loss, self._window_batches = 0.0, 0

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        count = float(logs.get("target_tokens", 0.0))
        delta = max(0.0, count - self._epoch_tokens_last)
        self._epoch_tokens_last = count
        self.tokens_total += delta
        self._window_tokens += delta
        # Keras reports the epoch's running mean; recover this batch's loss for the window mean.
        if "loss" in logs:
            loss_sum = float(logs["loss"]) * (batch + 1)
            self._window_loss += loss_sum - getattr(self, "_loss_sum", 0.0)
            self._window_batches += 1
            self._loss_sum = loss_sum
        step = current_step(self.model)
        now = time.monotonic()
        if step % self.log_every == 0 and step != self._last_logged_step and step > 0:
            self._last_logged_step = step
            window = now - self._window_start
            self.tokens_per_s = self._window_tokens / window if window > 0 else float("nan")
            self._window_tokens, self._window_start = 0.0, now
            window_loss = (self._window_loss / self._window_batches if self._window_batches
                           else float(logs.get("loss", float("nan"))))
            self._window_loss, self._window_batches = 0.0, 0
            row = {"loss": window_loss,
                   "learning_rate": current_learning_rate(self.model),
                   "tokens_per_s": self.tokens_per_s, "tokens_total": self.tokens_total,
                   "elapsed_s": self.clock.elapsed()}
            acc = _accuracy(logs)
            if acc is not None:
                row["accuracy"] = acc
            self.history.add(step, **row)
            self.history.save()
            if self.writer is not None:
                with self.writer.as_default(step=step):
                    for k in ("loss", "learning_rate", "tokens_per_s", "accuracy"):
                        if k in row:
                            tf.summary.scalar(k, row[k])
                self.writer.flush()
        if self.verbose and (now - self._last_print >= self.every_s or step == self.total_steps):
            self._last_print = now
            self.stream.write(self.line(step, logs) + "\n")
            self.stream.flush()

    def eta_seconds(self, step: int) -> float:
        session = time.monotonic() - self._session_start
        done = step - self.start_step
        by_steps = (self.total_steps - step) * session / done if done > 0 else float("inf")
        budget = self.clock.budget_seconds
        by_time = (budget - self.clock.elapsed()) if budget else float("inf")
        return min(by_steps, by_time)

    def line(self, step: int, logs: dict) -> str:
        pct = 100.0 * step / max(1, self.total_steps)
        acc = _accuracy(logs)
        parts = [f"step {step}/{self.total_steps} ({pct:.1f}%)",
                 f"loss {float(logs.get('loss', float('nan'))):.3f}"]
        if acc is not None:
            parts.append(f"acc {float(acc):.3f}")
        parts += [f"lr {current_learning_rate(self.model):.2e}",
                  f"{self.tokens_per_s:,.0f} tok/s" if math.isfinite(self.tokens_per_s)
                  else "? tok/s",
                  f"{_fmt_duration(self.clock.elapsed())} elapsed",
                  f"ETA {_fmt_duration(self.eta_seconds(step))}"]
        return " | ".join(parts)

    def on_train_end(self, logs=None):
        self.history.save()
        if self.writer is not None:
            self.writer.close()
