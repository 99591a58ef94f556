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
    train_state.json         status (complete once final.weights.h5 is written) and summary

Resumption after a crash or preemption (SIGKILL included): ``BackupAndRestore`` restores model,
optimizer (hence the schedule step) and epoch at the last epoch boundary; the dropout RNG state
and the training clock come back with it (:class:`~aiayn.pipeline.training.callbacks.ResumableBackup`),
and the data position is restored by skipping the batches that were consumed, so a resumed run
sees the same batches as an uninterrupted one (bit-identical with ``train.deterministic``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from aiayn.pipeline.config import Config, write_config
from aiayn.pipeline.data.corpus import split_path
from aiayn.pipeline.data.dataset import make_train_dataset
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_write
from aiayn.pipeline.training import callbacks as cb
from aiayn.pipeline.training import checkpoints
from aiayn.pipeline.training import distribute
from aiayn.pipeline.training.artifacts import RunFiles, build_model, dev_sample, load_tokenizer
from aiayn.pipeline.training.averaging import select_final_weights
from aiayn.pipeline.training.recipe import compile_model
from aiayn.pipeline.training.validation import make_translator, translate_sentences


def _train_path(cfg: Config) -> Path:
    path = Path(split_path(cfg, "train"))
    if not path.exists():
        raise UserInputError(f"{path} not found: prepare the data first with `aiayn data`.")
    return path


def make_input(cfg: Config, tokenizer, strategy: tf.distribute.Strategy, skip_steps: int):
    """The training input: per-replica token-budget batches, positioned after ``skip_steps``.

    One replica: the ``tf.data.Dataset`` itself. Several: ``distribute_datasets_from_function``
    so each replica gets its own ``data.token_budget`` batch; each input pipeline (one per
    worker) takes every n-th batch of the same seeded stream, so workers never see the same
    batch.
    """
    path = _train_path(cfg)
    accum = cfg.train.gradient_accumulation_steps
    seed = cfg.data.seed

    if strategy.num_replicas_in_sync == 1:
        ds = make_train_dataset(path, tokenizer, cfg.data, seed)
        return ds.skip(skip_steps * accum) if skip_steps else ds

    def dataset_fn(ctx: tf.distribute.InputContext):
        ds = make_train_dataset(path, tokenizer, cfg.data, seed)
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


def _worker_index() -> int:
    raw = os.environ.get("TF_CONFIG", "").strip()
    return int(json.loads(raw).get("task", {}).get("index", 0)) if raw else 0


def _finished_summary(files: RunFiles, stream) -> dict[str, Any] | None:
    """The stored summary when the run directory already holds a finished run."""
    if not (files.train_state.exists() and files.final.exists()):
        return None
    state = json.loads(files.train_state.read_text())
    if state.get("status") != "complete":
        return None
    stream.write(f"{files.root} already holds a finished run ({state['summary']['steps']} "
                 "steps); remove the directory or choose another train.run_dir to "
                 "train again.\n")
    return state["summary"]


class _Session:
    """One training session's objects: strategy, model, data, callbacks."""

    def __init__(self, cfg: Config, stream):
        self.cfg, self.stream, self.files = cfg, stream, RunFiles.of(cfg)
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
        self.skip_steps = checkpoints.restored_epoch(self.backup_dir) * t.steps_per_epoch
        self.dataset = make_input(cfg, self.tokenizer, self.strategy, self.skip_steps)
        self.history = cb.RunHistory(self.files.root, write=self.chief)
        self.history.truncate(self.skip_steps)
        self.clock = cb.TrainingClock()
        self.budget = cb.Budget(t.steps, t.max_minutes, self.clock)
        self.nan_guard = keras.callbacks.TerminateOnNaN()
        self.pairs = dev_sample(cfg, t.eval_max_sentences) if t.eval_every > 0 else []
        self.evaluator = None
        self.progress = cb.ProgressLogger(
            t.steps, self.history, self.clock, max_minutes=t.max_minutes,
            log_every=max(1, min(50, t.steps_per_epoch // 5)), every_s=30.0,
            summary_dir=self._metrics_dir(), stream=stream, verbose=self.chief)

    def _metrics_dir(self) -> Path | None:
        return self.files.tensorboard / "metrics" if self.chief else None

    def _dev_evaluator(self) -> cb.DevEvaluator:
        t, translator = self.cfg.train, make_translator(self.cfg, self.model, self.tokenizer)
        return cb.DevEvaluator(
            lambda sources: translate_sentences(translator, sources,
                                                batch_size=self.cfg.decode.batch_size),
            [s for s, _ in self.pairs], [r for _, r in self.pairs], every=t.eval_every,
            best_path=self.files.best, patience=t.early_stopping_patience,
            history=self.history, state_path=self.files.dev_eval_state,
            summary_dir=self._metrics_dir(), write=self.chief, stream=self.stream)

    def callbacks(self, extra: Sequence[keras.callbacks.Callback]) -> list:
        t = self.cfg.train
        callbacks: list[keras.callbacks.Callback] = [
            checkpoints.ResumableBackup(self.backup_dir, self.clock), self.budget, self.nan_guard,
            checkpoints.StepCheckpoints(self.files.checkpoints, t.checkpoint_every, t.keep_checkpoints,
                               write=self.chief),
        ]
        if self.pairs:
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
            f"{self.jit}; {t.steps} steps x {self.cfg.data.token_budget} tokens/replica x "
            f"{t.gradient_accumulation_steps} accumulation; time budget "
            f"{t.max_minutes or 'none'} min"
            + (f"; resuming from step {self.skip_steps}" if self.skip_steps else "") + "\n")
        self.stream.flush()
        return n_params

    def stop_reason(self) -> str:
        if self.nan_guard.model is not None and _weights_have_nan(self.model):
            return "nan"
        if self.evaluator is not None and self.evaluator.stopped_early:
            return "early_stopping"
        return self.budget.reason or "steps"


def train(cfg: Config, extra_callbacks: Sequence[keras.callbacks.Callback] = (),
          stream=None) -> dict[str, Any]:
    """Trains the Transformer of ``cfg`` on the prepared data; resumes if a backup exists.

    Args:
      cfg: the run configuration (``data``, ``model``, ``train``, ``decode``).
      extra_callbacks: further Keras callbacks (tests, custom logging).
      stream: where progress lines go (default stdout).

    Returns:
      A summary: ``steps``, ``stop_reason`` (steps | time | early_stopping | nan),
      ``train_seconds``, ``tokens_per_second`` (real target tokens), ``final_weights``,
      ``dev_bleu``/``dev_chrf`` of the chosen weights, ``averaging`` (the report), the
      resolved ``strategy``, ``replicas``, ``mixed_precision`` and ``jit_compile``.

    Raises:
      UserInputError: missing data or vocabulary, an invalid TF_CONFIG, or a diverged run.
    """
    stream = stream or sys.stdout
    finished = _finished_summary(RunFiles.of(cfg), stream)
    if finished is not None:
        return finished
    s = _Session(cfg, stream)
    t = cfg.train
    callbacks = s.callbacks(extra_callbacks)
    n_params = s.announce()
    s.clock.start()
    session_start = time.monotonic()
    s.model.fit(s.dataset, epochs=math.ceil(t.steps / t.steps_per_epoch), shuffle=False,
                steps_per_epoch=t.steps_per_epoch * t.gradient_accumulation_steps,
                callbacks=callbacks, verbose=0)
    session_seconds = time.monotonic() - session_start
    step, stop_reason = cb.current_step(s.model), s.stop_reason()
    stream.write(f"training stopped at step {step} ({stop_reason}) after "
                 f"{s.clock.elapsed() / 60:.1f} min of training.\n")
    summary: dict[str, Any] = {
        "steps": step, "stop_reason": stop_reason,
        "train_seconds": round(s.clock.elapsed(), 1),
        "tokens_per_second": round(s.progress.tokens_total_session / max(session_seconds, 1e-9),
                                   1),
        "strategy": type(s.strategy).__name__, "replicas": s.strategy.num_replicas_in_sync,
        "mixed_precision": s.policy, "jit_compile": s.jit, "parameters": n_params,
        "run_dir": str(s.files.root),
    }
    if s.evaluator is not None:
        summary["dev_history"] = s.evaluator.results
    if s.chief:
        _finish(s, summary)
    return summary


def _finish(s: _Session, summary: dict[str, Any]) -> None:
    """Chief only: choose and write the final weights, mark the run complete, drop backups."""
    if summary["stop_reason"] == "nan":
        raise UserInputError(
            f"Training diverged (NaN loss) at step {summary['steps']}. Lower "
            "train.learning_rate_scale or raise train.warmup_steps, then train again in a "
            "fresh train.run_dir.")
    report = select_final_weights(s.cfg, s.model, s.tokenizer, s.pairs or None,
                                  stream=s.stream)
    chosen = report["candidates"][report["chosen"]]
    summary.update({"final_weights": report["final_weights"], "averaging": report,
                    "dev_bleu": chosen.get("bleu"), "dev_chrf": chosen.get("chrf")})
    atomic_write(s.files.train_state, json.dumps({"status": "complete", "summary": summary},
                                                 indent=2, ensure_ascii=False))
    for d in s.files.root.glob("backup*"):
        shutil.rmtree(d, ignore_errors=True)


def _weights_have_nan(model: keras.Model) -> bool:
    return any(not np.all(np.isfinite(keras.ops.convert_to_numpy(v)))
               for v in model.trainable_weights)
