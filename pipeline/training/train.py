"""Training with ``model.fit``: the paper's recipe (§5), resumable, distributed, time-bounded.

    summary = train(cfg)                  # `aiayn train`

The recipe (§5: Adam, the warm-up schedule, label smoothing, accumulation) is in
:mod:`~aiayn.pipeline.training.recipe`; the callbacks in :mod:`~aiayn.pipeline.training.callbacks`;
the choice of final weights in :mod:`~aiayn.pipeline.training.averaging`; the run directory's
layout in :mod:`~aiayn.pipeline.training.artifacts`.

Steps are optimizer updates: ``train.steps``, ``checkpoint_every``, ``eval_every`` and
``steps_per_epoch`` all count them; ``model.fit`` sees ``steps_per_epoch * accumulation``
batches per epoch.

Run directory (``train.run_dir``):

    config.yaml              resolved configuration
    checkpoints/             ckpt-<step>.weights.h5, the last `keep_checkpoints`
    best.weights.h5          best dev BLEU seen during training
    backup/                  BackupAndRestore state; re-running the same command resumes
    history.json/.csv        loss, lr, tokens/s, dev BLEU/chrF per logged step
    tensorboard/             the same as TensorBoard scalars
    averaging.json           last vs. average of the last N (vs. best) on dev; the choice
    final.weights.h5         the chosen weights (evaluate and export read these)
    train_state.json         status (the end state, see train()) and summary
    train.lock               held while training (one `aiayn train` per run directory)

Resumption after a crash or preemption (SIGKILL included): ``BackupAndRestore`` restores model,
optimizer (hence the schedule step) and epoch at the last epoch boundary; the dropout RNG state
and the training clock come back with it
(:class:`~aiayn.pipeline.training.checkpoints.ResumableBackup`, which also writes the backup
crash-safely and repairs it on start), and the data position is restored by skipping the batches
that were consumed, so a resumed run sees the same batches as an uninterrupted one
(bit-identical with ``train.deterministic``). Every file of the run is written atomically;
temporaries left by a killed write are removed when the next run takes the lock.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import keras
import numpy as np
import tensorflow as tf

from aiayn.pipeline.config import Config, write_config
from aiayn.pipeline.data.corpus import split_path
from aiayn.pipeline.data.dataset import make_train_dataset
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_write, describe_holder, hold_lock, remove_leftovers
from aiayn.pipeline.tf_runtime import onednn_setting
from aiayn.pipeline.training import callbacks as cb
from aiayn.pipeline.training import checkpoints, distribute
from aiayn.pipeline.training.artifacts import (
    RunFiles,
    build_model,
    dev_sample,
    list_checkpoints,
    load_tokenizer,
)
from aiayn.pipeline.training.averaging import (
    candidate_count,
    select_final_weights,
    selection_pairs,
)
from aiayn.pipeline.training.deadline import Deadline
from aiayn.pipeline.training.dev_bleu import DevEvaluator
from aiayn.pipeline.training.dev_loss import DevLoss, dev_batches
from aiayn.pipeline.training.metrics import metric_settings_for
from aiayn.pipeline.training.recipe import compile_model, time_progress_variable
from aiayn.pipeline.training.validation import make_translator, translate_sentences


def _train_path(cfg: Config) -> Path:
    path = Path(split_path(cfg, "train"))
    if not path.exists():
        raise UserInputError(f"{path} not found: prepare the data first with `aiayn data`.")
    return path


def make_input(cfg: Config, tokenizer, strategy: tf.distribute.Strategy, skip_steps: int,
               stream=None):
    """The training input: per-replica token-budget batches, positioned after ``skip_steps``.

    One replica: the ``tf.data.Dataset`` itself. Several: ``distribute_datasets_from_function``
    so each replica gets its own ``data.token_budget`` batch; each input pipeline (one per
    worker) takes every n-th batch of the same seeded stream, so workers never see the same
    batch.

    First the training split is tokenised once and the length filter's counts (kept, dropped
    too long, dropped empty) are printed as one line on ``stream`` (default stdout) and, by the
    chief, recorded in ``<data_dir>/data_report.json`` under ``training_length_filter``.

    Raises:
      UserInputError: no prepared data, or no pair fits ``data.max_length`` (raised here, at
        once: the repeated pipeline would otherwise never yield a batch).
    """
    from aiayn.pipeline.data.corpus import update_report
    from aiayn.pipeline.data.dataset import length_filter_counts

    path = _train_path(cfg)
    accum = cfg.train.gradient_accumulation_steps
    seed = cfg.data.seed
    counts = length_filter_counts(path, tokenizer, cfg.data)
    stream = stream or sys.stdout
    stream.write(f"training length filter (data.max_length={counts['max_length']}): kept "
                 f"{counts['kept']} of {counts['pairs']} pairs of {path}; dropped "
                 f"{counts['dropped_too_long']} too long, {counts['dropped_empty']} with an empty "
                 "source\n")
    stream.flush()
    if distribute.is_chief():
        update_report(cfg.data.data_dir, training_length_filter={
            key: value for key, value in counts.items() if key != "files"} | {"file": str(path)})

    if strategy.num_replicas_in_sync == 1:
        ds = make_train_dataset(path, tokenizer, cfg.data, seed, length_counts=counts)
        return ds.skip(skip_steps * accum) if skip_steps else ds

    def dataset_fn(ctx: tf.distribute.InputContext):
        ds = make_train_dataset(path, tokenizer, cfg.data, seed, length_counts=counts)
        if ctx.num_input_pipelines > 1:
            ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        per_pipeline = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        return ds.skip(skip_steps * accum * per_pipeline) if skip_steps else ds

    return strategy.distribute_datasets_from_function(dataset_fn)


def _seed_everything(cfg: Config) -> None:
    # Before any tokenizer exists: tf.random.set_seed in eager mode clears the context's caches,
    # which destroys the SentencePiece op resources of tokenizers created earlier.
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(cfg.train.seed)


def sentences_after_training(cfg: Config) -> int:
    """The sentences ``make train`` translates after training (the deadline's reserve).

    Each candidate for the final weights on its dev pairs, then the test split, and the dev
    split unless the candidates translate all of it: then the kept candidate's translations are
    the final weights' dev evaluation (``averaging.select_final_weights``).
    """
    dev, chosen_on = _count_lines(split_path(cfg, "dev")), len(selection_pairs(cfg))
    return (candidate_count(cfg) * chosen_on + _count_lines(split_path(cfg, "test"))
            + (0 if chosen_on >= dev else dev))


def _count_lines(path: Path) -> int:
    """Lines of a prepared split (0 if it is absent)."""
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _worker_index() -> int:
    raw = os.environ.get("TF_CONFIG", "").strip()
    return int(json.loads(raw).get("task", {}).get("index", 0)) if raw else 0


END_STATES = ("complete", "time_budget", "diverged", "interrupted")
FINISHED = ("complete", "time_budget")  # final.weights.h5 written; a re-run returns the summary


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on SIGTERM or Ctrl-C; the run is recorded as ``interrupted`` and its
    backup kept, so the same command resumes it."""


def _lock_path(files: RunFiles) -> Path:
    """The chief's ``train.lock``; another worker's own (it writes its own ``backup-worker<i>``)."""
    distribute.tf_config_cluster()  # an invalid TF_CONFIG: UserInputError, before is_chief parses
    if distribute.is_chief():
        return files.lock
    return files.root / f"train-worker{_worker_index()}.lock"


def _last_good_checkpoint(files: RunFiles) -> tuple[int, Path] | None:
    ckpts = list_checkpoints(files.checkpoints)
    return ckpts[-1] if ckpts else None


def _diverged_advice(files: RunFiles, summary: dict[str, Any]) -> str:
    good = summary.get("last_good_checkpoint")
    where = (f"The last good checkpoint is {good} (step {summary.get('last_good_step')}; "
             "`aiayn evaluate` and `aiayn export` take it with --weights)" if good
             else "No checkpoint was written before it")
    return (f"{where}. To train again, use a fresh train.run_dir with a lower "
            "train.learning_rate_scale or more train.warmup_steps; or continue this run from "
            f"its last good backup (step {summary.get('resume_from_step', 0)}) with such a "
            f"setting: delete {files.train_state} and run again with the new --set.")


def _previous_end(files: RunFiles, stream) -> dict[str, Any] | None:
    """What an earlier run in this directory left: its summary if it finished, None to train.

    Raises:
      UserInputError: the run diverged (re-running it unchanged would diverge again).
    """
    try:
        state = json.loads(files.train_state.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet (the file is written atomically, never partly)
        return None
    status, summary = state.get("status"), state.get("summary") or {}
    if status in FINISHED and files.final.exists():
        stream.write(f"{files.root} already holds a finished run ({summary.get('steps')} steps, "
                     f"{status}); remove the directory or choose another train.run_dir to "
                     "train again.\n")
        return summary
    if status == "diverged":
        raise UserInputError(
            f"{files.root} holds a run that diverged (non-finite loss at step "
            f"{summary.get('diverged_at_step')}); running it again unchanged would diverge "
            f"again. {_diverged_advice(files, summary)}")
    return None  # no run yet, or an interrupted one: train (resuming from the backup)


def _remove_run_leftovers(files: RunFiles) -> None:
    """Temporaries of killed atomic writes of the files training owns (under its lock; the
    checkpoint and backup folders are cleaned by their callbacks)."""
    names = {p.name for p in (files.config, files.best, files.final, files.averaging,
                              files.history_json, files.history_csv, files.dev_eval_state,
                              files.train_state)}
    remove_leftovers(files.root, names)


class _Session:
    """One training session's objects: strategy, model, data, callbacks."""

    def __init__(self, cfg: Config, stream, started_at: float):
        self.cfg, self.stream, self.files = cfg, stream, RunFiles.of(cfg)
        self.started_at = started_at
        self.strategy = distribute.resolve_strategy(cfg.train.distribute)  # first: MWMS
        _seed_everything(cfg)
        self.chief = distribute.is_chief()
        self.policy = distribute.resolve_mixed_precision(cfg.train.mixed_precision)
        keras.mixed_precision.set_global_policy(self.policy)
        self.jit = distribute.resolve_jit_compile(cfg.train.jit_compile)
        self.tokenizer = load_tokenizer(cfg)
        self.files.root.mkdir(parents=True, exist_ok=True)
        if self.chief:
            write_config(cfg, self.files.config)
        with self.strategy.scope():
            self.model = build_model(cfg, self.tokenizer)
            compile_model(self.model, cfg, self.tokenizer.pad_id, self.jit, self.policy)
        t = cfg.train
        self.backup_dir = (self.files.backup if self.chief
                           else self.files.root / f"backup-worker{_worker_index()}")
        self.skip_steps = checkpoints.prepare_backup(self.backup_dir, stream) * t.steps_per_epoch
        self.dataset = make_input(cfg, self.tokenizer, self.strategy, self.skip_steps)
        self.history = cb.RunHistory(self.files.root, write=self.chief)
        self.history.truncate(self.skip_steps)
        self.clock = cb.TrainingClock(t.max_minutes)
        self.budget = cb.Budget(t.steps, self.clock)
        self.budget_progress = self._budget_progress()
        self.late_dropout = self._late_dropout()
        self.guard = cb.DivergenceGuard(stream)
        self.stopper = cb.SignalStop()
        self.pairs = (dev_sample(cfg, t.eval_max_sentences)
                      if t.eval_every > 0 or t.dev_loss_every > 0 else [])
        self.evaluator = None
        self.deadline = self._deadline()
        self.progress = cb.ProgressLogger(
            t.steps, self.history, self.clock,
            log_every=max(1, min(50, t.steps_per_epoch // 5)), every_s=30.0,
            summary_dir=self._metrics_dir(), stream=stream, verbose=self.chief)

    def _budget_progress(self) -> cb.BudgetProgress | None:
        """The time budget's share for a learning rate that decays to zero at its end."""
        t, variable = self.cfg.train, time_progress_variable(self.model.optimizer)
        if variable is None or not self._timed():
            return None
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            raise UserInputError(
                f"train.lr_schedule={t.lr_schedule} with a time budget cannot run on several "
                "workers (each worker's clock would give its replicas a different learning "
                "rate). Set train.max_minutes=0 and train.deadline_minutes=0 and end the run by "
                "train.steps, or use train.lr_schedule=rsqrt.")
        return cb.BudgetProgress(variable, self.clock)

    def _timed(self) -> bool:
        """Whether the clock ends the run (train.max_minutes or train.deadline_minutes)."""
        return bool(self.cfg.train.max_minutes or self.cfg.train.deadline_minutes)

    def _deadline(self) -> Deadline | None:
        """The budget that ends the whole job by ``train.deadline_minutes``, or None."""
        t = self.cfg.train
        if not t.deadline_minutes:
            return None
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            raise UserInputError(
                f"train.deadline_minutes={t.deadline_minutes:g} cannot run on several workers "
                "(each worker would set its own time budget from its own clock). Set "
                "train.deadline_minutes=0 and bound the run with train.steps.")
        return Deadline(self.clock, self.started_at + 60.0 * t.deadline_minutes,
                        sentences_after_training(self.cfg),
                        len(self.pairs) if t.eval_every > 0 else 0,
                        lambda: self.evaluator.results if self.evaluator is not None else [],
                        cap_minutes=t.max_minutes, stream=self.stream)

    def _late_dropout(self) -> cb.LateDropout | None:
        """Dropout off for the run's first ``train.late_dropout`` share, or None."""
        t = self.cfg.train
        if not t.late_dropout:
            return None
        if self._timed() and isinstance(self.strategy,
                                        tf.distribute.MultiWorkerMirroredStrategy):
            raise UserInputError(
                f"train.late_dropout={t.late_dropout:g} with a time budget cannot run on "
                "several workers (each worker's clock would switch dropout on at a different "
                "step, and each switch retraces the step's collectives). Set "
                "train.max_minutes=0 and train.deadline_minutes=0 and end the run by "
                "train.steps, or train.late_dropout=0.")
        return cb.LateDropout(t.late_dropout, t.steps, self.clock, self.stream)

    def _metrics_dir(self) -> Path | None:
        return self.files.tensorboard / "metrics" if self.chief else None

    def _stopping(self) -> bool:
        """True once nothing more may be saved: a non-finite loss, or SIGTERM."""
        return self.guard.diverged or self.stopper.received is not None

    def _dev_evaluator(self) -> DevEvaluator:
        t, translator = self.cfg.train, make_translator(self.cfg, self.model, self.tokenizer)
        return DevEvaluator(
            lambda sources: translate_sentences(translator, sources,
                                                batch_size=self.cfg.decode.batch_size),
            [s for s, _ in self.pairs], [r for _, r in self.pairs], every=t.eval_every,
            best_path=self.files.best, patience=t.early_stopping_patience,
            history=self.history, state_path=self.files.dev_eval_state,
            summary_dir=self._metrics_dir(), write=self.chief, stream=self.stream,
            skip_if=self._stopping, metrics=metric_settings_for(self.cfg))

    def _dev_loss(self) -> DevLoss:
        cfg = self.cfg
        batches = dev_batches(self.pairs, self.tokenizer, cfg.data.max_length,
                              self.tokenizer.pad_id)
        return DevLoss(batches, self.model.loss, self.tokenizer.pad_id,
                       cfg.train.dev_loss_every, history=self.history,
                       summary_dir=self._metrics_dir(), stream=self.stream)

    def callbacks(self, extra: Sequence[keras.callbacks.Callback]) -> list:
        t = self.cfg.train
        # Order matters: the backup restores the model before the others read its step; the
        # guard and the signal stop run before the writers at each batch end.
        callbacks: list[keras.callbacks.Callback] = [
            checkpoints.ResumableBackup(self.backup_dir, self.clock, skip_if=self._stopping,
                                        stream=self.stream),
            *([self.deadline] if self.deadline else []),
            self.guard, self.stopper, self.budget,
            *([self.budget_progress] if self.budget_progress else []),
            *([self.late_dropout] if self.late_dropout else []),
            checkpoints.StepCheckpoints(self.files.checkpoints, t.checkpoint_every,
                                        t.keep_checkpoints, write=self.chief,
                                        skip_if=self._stopping),
        ]
        if self.pairs and t.dev_loss_every > 0:
            callbacks.append(self._dev_loss())
        if self.pairs and t.eval_every > 0:
            self.evaluator = self._dev_evaluator()
            callbacks.append(self.evaluator)
        callbacks.append(self.progress)
        if self.chief:  # tensorboard is a dependency of the project
            callbacks.append(keras.callbacks.TensorBoard(
                str(self.files.tensorboard), update_freq=self.progress.log_every,
                write_graph=False))
        return callbacks + list(extra)

    def announce(self) -> int:
        t, strategy = self.cfg.train, self.strategy
        n_params = sum(int(np.prod(v.shape)) for v in self.model.trainable_weights)
        self.stream.write(
            f"training {n_params / 1e6:.1f}M parameters on {type(strategy).__name__} "
            f"({strategy.num_replicas_in_sync} replica(s)); policy {self.policy}; jit_compile "
            f"{self.jit}; oneDNN {onednn_setting()}; {t.steps} steps x "
            f"{self.cfg.data.token_budget} tokens/replica x "
            f"{t.gradient_accumulation_steps} accumulation; time budget "
            f"{self._budget_text()}"
            + (f"; resuming from step {self.skip_steps}" if self.skip_steps else "") + "\n")
        self.stream.flush()
        return n_params

    def _budget_text(self) -> str:
        t = self.cfg.train
        if not t.deadline_minutes:
            return f"{t.max_minutes or 'none'} min"
        return (f"what ends the job {t.deadline_minutes:g} min after it started"
                + (f", at most {t.max_minutes:g} min" if t.max_minutes else ""))

    def end_state(self) -> tuple[str, str]:
        """``(end state, stop reason)`` of the fit that just ended (the mapping: train())."""
        if self.guard.diverged:
            return "diverged", "nan"
        if self.stopper.received == "SIGINT":  # Ctrl-C: whatever fit had reached
            return "interrupted", "interrupted"
        if self.evaluator is not None and self.evaluator.stopped_early:
            return "complete", "early_stopping"
        if self.budget.reason == "time":
            return "time_budget", "time"
        if self.budget.reason == "steps" or self.stopper.received is None:
            return "complete", "steps"
        return "interrupted", "interrupted"


def train(cfg: Config, extra_callbacks: Sequence[keras.callbacks.Callback] = (),
          stream=None, started_at: float | None = None) -> dict[str, Any]:
    """Trains the Transformer of ``cfg`` on the prepared data; resumes if a backup exists.

    One process per run directory: training holds ``<run_dir>/train.lock`` (another worker of
    a cluster its own ``train-worker<i>.lock``); a second ``train`` on the directory fails at
    once, naming the holder (pid, host, start time, command). The lock of a process that died
    is taken over.

    A run ends in one of four states, recorded as ``status`` in ``train_state.json`` and as
    ``end_state`` (with ``stop_reason``) in the summary:

    - ``complete``, stop_reason ``steps`` (``train.steps`` reached, or all of fit's batches run)
      or ``early_stopping`` (dev BLEU stopped improving): the final weights are chosen, the
      backup deleted. A re-run returns the stored summary.
    - ``time_budget``, stop_reason ``time``: the time budget (``train.max_minutes``, or what
      ``train.deadline_minutes`` leaves: :mod:`~aiayn.pipeline.training.deadline`) of training
      (all attempts counted) used up; the final weights are chosen from the checkpoints, as
      for ``complete``. A re-run returns the stored summary.
    - ``diverged``, stop_reason ``nan``: a non-finite (NaN or inf) loss, seen on the loss under
      every precision policy. Nothing from that step on is written (no checkpoint, backup, best
      or final weights); the summary adds ``diverged_at_step``, ``non_finite_loss``,
      ``last_good_checkpoint``/``last_good_step`` and ``resume_from_step`` (the backup, kept).
      Raises UserInputError naming the last good checkpoint and what to do; so does a re-run.
    - ``interrupted``, stop_reason ``interrupted``: SIGTERM (training stops at the next batch
      end) or Ctrl-C during fit. The backup of the last epoch boundary is kept (the summary's
      ``resume_from_step``); raises TrainingInterrupted (a KeyboardInterrupt). The same
      command resumes.

    A killed process (SIGKILL, power loss) records nothing: the same command resumes it.

    Args:
      cfg: the run configuration (``data``, ``model``, ``train``, ``decode``).
      extra_callbacks: further Keras callbacks (tests, custom logging).
      stream: where progress lines go (default stdout).
      started_at: ``time.time()`` at which the job began, from which
        ``train.deadline_minutes`` counts (default: now; ``aiayn run`` passes its own start,
        ``make train`` the start of its set-up).

    Returns:
      A summary: ``steps``, ``end_state``, ``stop_reason``, ``train_seconds``,
      ``time_budget_seconds`` (0: none), ``tokens_per_second`` (real target tokens),
      ``final_weights``, ``dev_bleu``/``dev_chrf`` of the chosen weights, ``averaging`` (the
      report), the resolved ``strategy``, ``replicas``, ``mixed_precision`` and
      ``jit_compile``.

    Raises:
      UserInputError: missing data or vocabulary, an invalid TF_CONFIG, a deadline that leaves
        less than a minute of training, the run directory in
        use by another process (``LockHeld``), or a diverged run (now or before).
      TrainingInterrupted: SIGTERM or Ctrl-C (recorded as ``interrupted``).
    """
    stream = stream or sys.stdout
    files = RunFiles.of(cfg)
    files.root.mkdir(parents=True, exist_ok=True)
    with hold_lock(_lock_path(files), f"The run directory {files.root}") as lock:
        if lock["previous"]:
            stream.write(f"(taking over the lock of {describe_holder(lock['previous'])}, which "
                         "ended without releasing it)\n")
        finished = _previous_end(files, stream)
        if finished is not None:
            return finished
        if distribute.is_chief():
            _remove_run_leftovers(files)
        with _global_policy_kept():
            return _train_locked(cfg, extra_callbacks, stream,
                                 time.time() if started_at is None else started_at)


@contextlib.contextmanager
def _global_policy_kept():
    """Training sets Keras's global dtype policy (``train.mixed_precision``); the caller's comes
    back afterwards, so that models built later in the process (a notebook's, a test's) are not
    silently ``mixed_bfloat16`` because a CPU has bf16 units."""
    previous = keras.mixed_precision.global_policy()
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


@contextlib.contextmanager
def _sigterm_stops(stopper: cb.SignalStop):
    """SIGTERM -> a clean stop at the next batch end, while fit runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, stopper.handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _train_locked(cfg: Config, extra_callbacks: Sequence[keras.callbacks.Callback],
                  stream, started_at: float) -> dict[str, Any]:
    s = _Session(cfg, stream, started_at)
    callbacks = s.callbacks(extra_callbacks)
    n_params = s.announce()
    session_seconds = _fit(s, callbacks)
    step = cb.current_step(s.model)
    end_state, stop_reason = s.end_state()
    stream.write(f"training stopped at step {step} ({stop_reason}; {end_state}) after "
                 f"{s.clock.elapsed() / 60:.1f} min of training.\n")
    summary = _summary(s, step, end_state, stop_reason, session_seconds, n_params)
    if end_state in FINISHED:
        if s.chief:
            _finish(s, summary)
        return summary
    _stop_unfinished(s, summary)


def _fit(s: _Session, callbacks: list[keras.callbacks.Callback]) -> float:
    """Runs ``model.fit`` until done or stopped (SIGTERM, Ctrl-C); its wall-clock seconds."""
    t = s.cfg.train
    s.clock.start()
    session_start = time.monotonic()
    try:
        with _sigterm_stops(s.stopper):
            s.model.fit(s.dataset, epochs=math.ceil(t.steps / t.steps_per_epoch), shuffle=False,
                        steps_per_epoch=t.steps_per_epoch * t.gradient_accumulation_steps,
                        callbacks=callbacks, verbose=0)
    except KeyboardInterrupt:
        s.stopper.received = "SIGINT"
    return time.monotonic() - session_start


def _summary(s: _Session, step: int, end_state: str, stop_reason: str, session_seconds: float,
             n_params: int) -> dict[str, Any]:
    """The summary :func:`train` returns, before the final weights are chosen."""
    summary: dict[str, Any] = {
        "steps": step, "end_state": end_state, "stop_reason": stop_reason,
        "train_seconds": round(s.clock.elapsed(), 1),
        "time_budget_seconds": round(s.clock.budget_seconds, 1),
        "tokens_per_second": round(s.progress.tokens_total_session / max(session_seconds, 1e-9),
                                   1),
        "strategy": type(s.strategy).__name__, "replicas": s.strategy.num_replicas_in_sync,
        "mixed_precision": s.policy, "jit_compile": s.jit, "onednn": onednn_setting(),
        "parameters": n_params,
        "run_dir": str(s.files.root),
    }
    if s.late_dropout is not None and s.late_dropout.enabled_at is not None:
        summary["dropout_from_step"] = s.late_dropout.enabled_at
    if s.evaluator is not None:
        summary["dev_history"] = s.evaluator.results
    return summary


def _stop_unfinished(s: _Session, summary: dict[str, Any]) -> NoReturn:
    """A diverged or interrupted run: records it (chief) and raises.

    Raises:
      UserInputError: the run diverged.
      TrainingInterrupted: SIGTERM or Ctrl-C.
    """
    t = s.cfg.train
    summary["resume_from_step"] = checkpoints.restored_epoch(s.backup_dir) * t.steps_per_epoch
    if summary["end_state"] == "diverged":
        good = _last_good_checkpoint(s.files)
        summary.update({"diverged_at_step": s.guard.step, "non_finite_loss": str(s.guard.loss),
                        "last_good_checkpoint": str(good[1]) if good else None,
                        "last_good_step": good[0] if good else None})
        if s.chief:
            _record(s.files, summary)
        raise UserInputError(
            f"Training diverged: the loss was {s.guard.loss} at step {s.guard.step}, so nothing "
            f"from that step on was saved (no final.weights.h5). "
            f"{_diverged_advice(s.files, summary)}")
    if s.chief:
        _record(s.files, summary)
    message = (f"training interrupted ({s.stopper.received}) at step {summary['steps']}; the "
               f"backup (step {summary['resume_from_step']}) is kept: run the same command to "
               "resume.")
    s.stream.write(message + "\n")
    s.stream.flush()
    raise TrainingInterrupted(message)


def _model_as_served(s: _Session) -> keras.Model:
    """The model the final weights are scored in: float32, as evaluation and the export run them.

    Under ``mixed_bfloat16`` the training model decodes in bfloat16, and the dev BLEU of the
    same weights on the same 200 verses moved by up to 0.45 between the two (25.88 against
    26.23 for one checkpoint): enough to choose other weights than float32 scores would.
    """
    if s.policy == "float32":
        return s.model
    keras.mixed_precision.set_global_policy("float32")  # _global_policy_kept restores it
    return build_model(s.cfg, s.tokenizer)


def _record(files: RunFiles, summary: dict[str, Any]) -> None:
    """``train_state.json``: the end state and the summary (atomically)."""
    atomic_write(files.train_state, json.dumps({"status": summary["end_state"],
                                                "summary": summary}, indent=2,
                                               ensure_ascii=False))


def _finish(s: _Session, summary: dict[str, Any]) -> None:
    """Chief only: choose and write the final weights, record the end state, drop backups."""
    report = select_final_weights(s.cfg, _model_as_served(s), s.tokenizer, stream=s.stream)
    dev_evaluation = report.pop("dev_evaluation", None)
    chosen = report["candidates"][report["chosen"]]
    summary.update({"final_weights": report["final_weights"], "averaging": report,
                    "dev_bleu": chosen.get("bleu"), "dev_chrf": chosen.get("chrf")})
    _record(s.files, summary)
    if dev_evaluation is not None:
        # This job's only (not in train_state.json): `make train` reads it instead of
        # translating the dev split again; a later job cannot know the weights are unchanged.
        summary["dev_evaluation"] = dev_evaluation
    for d in s.files.root.glob("backup*"):
        shutil.rmtree(d, ignore_errors=True)
