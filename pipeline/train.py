"""Training with ``model.fit``: the paper's recipe (§5), resumable, distributed, time-bounded.

    summary = train(cfg)                  # `aiayn train`
    average_checkpoints_for_run(cfg)      # `aiayn average` (train() already does this at the end)

Recipe (Vaswani et al., 2017, §5): Adam with beta_1=0.9, beta_2=0.98, epsilon=1e-9; learning rate
``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (§5.3, ``TransformerSchedule``); label
smoothing 0.1 over real target tokens (§5.4); dropout from the preset; token-budget batches
(§5.1, per replica); gradient accumulation (``gradient_accumulation_steps`` of the Keras 3
optimizer) to reach large effective batches on small hardware.

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
and the training clock come back with it (:class:`~aiayn.pipeline.callbacks.ResumableBackup`),
and the data position is restored by skipping the batches that were consumed, so a resumed run
sees the same batches as an uninterrupted one (bit-identical with ``train.deterministic``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
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

from aiayn.pipeline import callbacks as cb
from aiayn.pipeline import distribute
from aiayn.pipeline.config import Config, write_config
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.evaluate import (FINAL_WEIGHTS, build_model, dummy_features, load_tokenizer,
                                     score, translate_sentences)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Recipe pieces


@keras.saving.register_keras_serializable(package="aiayn")
class AccumulatedSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Feeds ``schedule`` the update step when gradients are accumulated.

    Keras 3 optimizers call the schedule with the *micro-batch* counter (``_iterations``), which
    runs ``accumulation_steps`` times faster than the update step the paper's warmup counts.
    """

    def __init__(self, schedule, accumulation_steps: int):
        self.schedule = schedule
        self.accumulation_steps = int(accumulation_steps)

    def __call__(self, step):
        return self.schedule(keras.ops.floor_divide(step, self.accumulation_steps))

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "accumulation_steps": self.accumulation_steps}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]),
                   config["accumulation_steps"])


def make_schedule(cfg: Config):
    """§5.3 schedule with ``train.learning_rate_scale``, accumulation-aware."""
    from aiayn.models.schedule import TransformerSchedule

    schedule = TransformerSchedule(cfg.model.hidden_dim, cfg.train.warmup_steps,
                                   scale=cfg.train.learning_rate_scale)
    accum = cfg.train.gradient_accumulation_steps
    return AccumulatedSchedule(schedule, accum) if accum > 1 else schedule


def make_optimizer(cfg: Config) -> keras.optimizers.Optimizer:
    """Adam(beta_1, beta_2, epsilon) on the §5.3 schedule, with gradient accumulation."""
    t = cfg.train
    accum = t.gradient_accumulation_steps
    return keras.optimizers.Adam(
        learning_rate=make_schedule(cfg), beta_1=t.beta_1, beta_2=t.beta_2, epsilon=t.epsilon,
        clipnorm=t.clipnorm or None, gradient_accumulation_steps=accum if accum > 1 else None)


def make_loss_and_metrics(cfg: Config, pad_id: int):
    from aiayn.models.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy

    loss = MaskedLabelSmoothedCrossEntropy(label_smoothing=cfg.train.label_smoothing,
                                           pad_id=pad_id)
    return loss, [MaskedAccuracy(pad_id=pad_id), cb.TargetTokens(pad_id=pad_id)]


def compile_model(model: keras.Model, cfg: Config, pad_id: int, jit_compile: bool,
                  policy: str) -> None:
    optimizer = make_optimizer(cfg)
    if policy == "mixed_float16":
        # Dynamic loss scaling keeps float16 gradients from underflowing.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    loss, metrics = make_loss_and_metrics(cfg, pad_id)
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=jit_compile)
    model.optimizer.build(model.trainable_variables)
    if getattr(model, "_distribute_strategy", None) is not None:
        _prebuild_for_strategy(model)
    if isinstance(model.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
        _report_rank1_logs(model)


def _report_rank1_logs(model: keras.Model) -> None:
    """Works around Keras 3 + MultiWorkerMirroredStrategy (tensorflow/tensorflow#72388).

    Keras reduces the per-replica step logs with ``strategy.reduce("MEAN", v, axis=0)``, which
    fails on scalar metrics. Returning each log as shape ``(1,)`` makes that reduction the mean
    over replicas, a scalar again. Token counts are scaled by the replica count first, so their
    mean is the global sum.
    """
    original = model.train_step
    replicas = model.distribute_strategy.num_replicas_in_sync

    def train_step(data):
        logs = original(data)
        return {k: keras.ops.expand_dims(v * replicas if k == "target_tokens" else v, 0)
                for k, v in logs.items()}

    model.train_step = train_step


def _prebuild_for_strategy(model: keras.Model) -> None:
    """Builds the compiled loss and metrics now, from a local dummy batch.

    Under a non-default strategy, Keras 3's TF trainer (`_maybe_symbolic_build`, 3.15) pulls
    one batch from the distributed iterator to build them, which (a) fails for dict features
    (it tries to reduce the `PerReplica` dict) and (b) silently consumes a batch, shifting the
    data position that resumption relies on. With everything built here, that step has nothing
    left to do, so it is skipped for this model.
    """
    features = dummy_features()
    labels = features["decoder_token_ids"]
    with model.distribute_strategy.scope():
        model._symbolic_build(data_batch=(features, labels))
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


# --------------------------------------------------------------------------------------------
# Data


def split_file(cfg: Config, split: str) -> Path:
    """The prepared TSV of ``split`` (``corpus.split_path``; ``<data_dir>/<split>.tsv``)."""
    try:
        from aiayn.pipeline.corpus import split_path
    except ImportError:  # the prepared-data layout of docs/CONTRACTS.md
        return Path(cfg.data.data_dir) / f"{split}.tsv"
    return Path(split_path(cfg, split))


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """The ``(source, target)`` pairs of a prepared TSV (``corpus.read_tsv_pairs``)."""
    try:
        from aiayn.pipeline.corpus import read_tsv_pairs
    except ImportError:
        with open(path, encoding="utf-8") as f:
            return [tuple(line.rstrip("\n").split("\t", 1)) for line in f if line.strip()]
    return read_tsv_pairs(path)


def _train_path(cfg: Config) -> Path:
    path = split_file(cfg, "train")
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
    from aiayn.pipeline.dataset import make_train_dataset

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


def dev_pairs(cfg: Config, limit: int) -> list[tuple[str, str]]:
    """Up to ``limit`` dev pairs (0 = all), evenly spaced over the dev split."""
    path = split_file(cfg, "dev")
    if not path.exists():
        return []
    pairs = read_pairs(path)
    if not limit or limit >= len(pairs):
        return pairs
    # Evenly spaced over the split (held-out books are contiguous: the first N would all come
    # from the first book).
    return [pairs[i * len(pairs) // limit] for i in range(limit)]


# --------------------------------------------------------------------------------------------
# Checkpoint averaging and the choice of final weights


def average_weight_files(model: keras.Model, paths: Sequence[str | os.PathLike]) -> None:
    """Sets ``model``'s weights to the element-wise mean of the weight files (paper §6.1).

    Each file is loaded into ``model`` in turn and summed in float64; non-float variables
    (counters) keep the last file's value.

    Raises:
      ValueError: no paths.
    """
    paths = list(paths)
    if not paths:
        raise ValueError("average_weight_files needs at least one weights file.")
    variables = [v for v in model.weights if not v.path.endswith("seed_generator_state")]
    sums: list[np.ndarray | None] = [None] * len(variables)
    for path in paths:
        cb.load_model_weights(model, path)
        for i, v in enumerate(variables):
            value = keras.ops.convert_to_numpy(v)
            if not np.issubdtype(value.dtype, np.floating):
                sums[i] = value
            else:
                sums[i] = value.astype(np.float64) if sums[i] is None else sums[i] + value
    for v, total in zip(variables, sums):
        if np.issubdtype(total.dtype, np.floating):
            v.assign((total / len(paths)).astype(keras.ops.convert_to_numpy(v).dtype))
        else:
            v.assign(total)


def select_final_weights(cfg: Config, model: keras.Model, tokenizer,
                         pairs: Sequence[tuple[str, str]] | None = None,
                         stream=None) -> dict[str, Any]:
    """Scores the last checkpoint, the average of the last N and the best-dev weights on dev.

    The best of them is written to ``<run_dir>/final.weights.h5``; all scores go to
    ``<run_dir>/averaging.json``. Without dev data the average (or the last) is kept unscored.

    Returns:
      The averaging report (candidates with their BLEU/chrF, ``chosen``).
    """
    stream = stream or sys.stdout
    run_dir = Path(cfg.train.run_dir)
    ckpts = cb.list_checkpoints(run_dir / "checkpoints")
    if not ckpts:
        raise UserInputError(f"No checkpoints in {run_dir / 'checkpoints'}: train first with "
                             "`aiayn train`.")
    if pairs is None:
        pairs = dev_pairs(cfg, cfg.train.eval_max_sentences)
    last_n = [p for _, p in ckpts[-max(1, cfg.train.average_last):]]
    candidates: list[tuple[str, Any, list[str]]] = [("last", None, [str(ckpts[-1][1])])]
    if len(last_n) > 1:
        candidates.append((f"average_last_{len(last_n)}", None, [str(p) for p in last_n]))
    best_path = run_dir / "best.weights.h5"
    state_path = run_dir / "dev_eval_state.json"
    if best_path.exists() and state_path.exists():
        best_step = json.loads(state_path.read_text()).get("best_step", -1)
        if best_step != ckpts[-1][0]:
            candidates.append((f"best_dev_step_{best_step}", None, [str(best_path)]))
    report: dict[str, Any] = {"checkpoints": [str(p) for _, p in ckpts],
                              "average_last": len(last_n), "dev_sentences": len(pairs),
                              "candidates": {}}
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    best_name, best_bleu = None, -1.0
    for name, _, files in candidates:
        average_weight_files(model, files)
        entry: dict[str, Any] = {"files": files}
        if pairs:
            start = time.monotonic()
            hyps = translate_sentences(model, tokenizer, sources, cfg.decode,
                                       max_length=cfg.data.max_length)
            entry.update({k: v for k, v in score(hyps, references).items()
                          if k != "bleu_detail"})
            entry["seconds"] = round(time.monotonic() - start, 1)
            stream.write(f"dev {name}: BLEU {entry['bleu']:.2f} chrF {entry['chrf']:.2f}\n")
            stream.flush()
            better = entry["bleu"] > best_bleu
        else:
            better = best_name is None or name.startswith("average")
        report["candidates"][name] = entry
        if better:
            best_name, best_bleu = name, entry.get("bleu", -1.0)
    report["chosen"] = best_name
    average_weight_files(model, report["candidates"][best_name]["files"])
    final = cb.save_model_weights(model, run_dir / FINAL_WEIGHTS)
    report["final_weights"] = str(final)
    cb._atomic_write_text(run_dir / "averaging.json", json.dumps(report, indent=2,
                                                                 ensure_ascii=False))
    stream.write(f"final weights: {best_name} -> {final}\n")
    stream.flush()
    return report


def average_checkpoints_for_run(cfg: Config) -> dict[str, Any]:
    """`aiayn average`: last vs. average of the last ``train.average_last`` checkpoints on dev.

    Writes ``final.weights.h5`` (the better) and ``averaging.json`` (both scores).
    """
    tokenizer = load_tokenizer(cfg)
    model = build_model(cfg, tokenizer)
    return select_final_weights(cfg, model, tokenizer)


# --------------------------------------------------------------------------------------------
# The training job


def _state_path(cfg: Config) -> Path:
    return Path(cfg.train.run_dir) / "train_state.json"


def _seed_everything(cfg: Config) -> None:
    # Before any tokenizer exists: tf.random.set_seed in eager mode clears the context's caches,
    # which destroys the SentencePiece op resources of tokenizers created earlier.
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(cfg.train.seed)


def _worker_index() -> int:
    raw = os.environ.get("TF_CONFIG", "").strip()
    return int(json.loads(raw).get("task", {}).get("index", 0)) if raw else 0


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
      UserInputError: missing data or vocabulary, or an invalid TF_CONFIG.
    """
    stream = stream or sys.stdout
    run_dir = Path(cfg.train.run_dir)
    state_path = _state_path(cfg)
    if state_path.exists() and (run_dir / FINAL_WEIGHTS).exists():
        state = json.loads(state_path.read_text())
        if state.get("status") == "complete":
            stream.write(f"{run_dir} already holds a finished run ({state['summary']['steps']} "
                         "steps); remove the directory or choose another train.run_dir to "
                         "train again.\n")
            return state["summary"]

    strategy = distribute.resolve_strategy(cfg.train.distribute)  # first: MWMS needs it early
    _seed_everything(cfg)
    chief = distribute.is_chief()
    policy = distribute.resolve_mixed_precision(cfg.train.mixed_precision)
    keras.mixed_precision.set_global_policy(policy)
    jit = distribute.resolve_jit_compile(cfg.train.jit_compile)
    tokenizer = load_tokenizer(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    if chief:
        write_config(cfg, run_dir / "config.yaml")

    with strategy.scope():
        model = build_model(cfg, tokenizer)
        compile_model(model, cfg, tokenizer.pad_id, jit, policy)

    t = cfg.train
    accum = t.gradient_accumulation_steps
    backup_dir = run_dir / ("backup" if chief else f"backup-worker{_worker_index()}")
    initial_epoch = cb.restored_epoch(backup_dir)
    skip_steps = initial_epoch * t.steps_per_epoch
    epochs = math.ceil(t.steps / t.steps_per_epoch)
    dataset = make_input(cfg, tokenizer, strategy, skip_steps)

    history = cb.RunHistory(run_dir, write=chief)
    history.truncate(skip_steps)
    clock = cb.TrainingClock()
    budget = cb.Budget(t.steps, t.max_minutes, clock)
    nan_guard = keras.callbacks.TerminateOnNaN()
    tb_dir = run_dir / "tensorboard"
    progress = cb.ProgressLogger(
        t.steps, history, clock, max_minutes=t.max_minutes,
        log_every=max(1, min(50, t.steps_per_epoch // 5)), every_s=30.0,
        summary_dir=tb_dir / "metrics" if chief else None, stream=stream, verbose=chief)
    callbacks: list[keras.callbacks.Callback] = [
        cb.ResumableBackup(backup_dir, clock), budget, nan_guard,
        cb.StepCheckpoints(run_dir / "checkpoints", t.checkpoint_every, t.keep_checkpoints,
                           write=chief),
    ]
    pairs = dev_pairs(cfg, t.eval_max_sentences) if t.eval_every > 0 else []
    evaluator = None
    if pairs:
        evaluator = cb.DevEvaluator(
            lambda sources: translate_sentences(model, tokenizer, sources, cfg.decode,
                                                max_length=cfg.data.max_length),
            [s for s, _ in pairs], [r for _, r in pairs], every=t.eval_every,
            best_path=run_dir / "best.weights.h5", patience=t.early_stopping_patience,
            history=history, state_path=run_dir / "dev_eval_state.json",
            summary_dir=tb_dir / "metrics" if chief else None, write=chief, stream=stream)
        callbacks.append(evaluator)
    callbacks.append(progress)
    if chief and not cb.tensorboard_available():
        stream.write("note: the `tensorboard` package is not installed; TensorBoard logs are "
                     "off (history.json/.csv still record every metric).\n")
    elif chief:
        callbacks.append(keras.callbacks.TensorBoard(str(tb_dir), update_freq=progress.log_every,
                                                     write_graph=False))
    callbacks += list(extra_callbacks)

    n_params = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    stream.write(
        f"training {n_params / 1e6:.1f}M parameters on {type(strategy).__name__} "
        f"({strategy.num_replicas_in_sync} replica(s)); policy {policy}; jit_compile {jit}; "
        f"{t.steps} steps x {cfg.data.token_budget} tokens/replica x {accum} accumulation; "
        f"time budget {t.max_minutes or 'none'} min"
        + (f"; resuming from step {skip_steps}" if skip_steps else "") + "\n")
    stream.flush()
    clock.start()
    session_start = time.monotonic()
    model.fit(dataset, epochs=epochs, shuffle=False, steps_per_epoch=t.steps_per_epoch * accum,
              callbacks=callbacks, verbose=0)
    session_seconds = time.monotonic() - session_start
    step = cb.current_step(model)

    if nan_guard.model is not None and _weights_have_nan(model):
        stop_reason = "nan"
    elif evaluator is not None and evaluator.stopped_early:
        stop_reason = "early_stopping"
    else:
        stop_reason = budget.reason or "steps"
    stream.write(f"training stopped at step {step} ({stop_reason}) after "
                 f"{clock.elapsed() / 60:.1f} min of training.\n")
    summary: dict[str, Any] = {
        "steps": step, "stop_reason": stop_reason,
        "train_seconds": round(clock.elapsed(), 1),
        "tokens_per_second": round(progress.tokens_total_session / max(session_seconds, 1e-9), 1),
        "strategy": type(strategy).__name__, "replicas": strategy.num_replicas_in_sync,
        "mixed_precision": policy, "jit_compile": jit, "parameters": n_params,
        "run_dir": str(run_dir),
    }
    if evaluator is not None:
        summary["dev_history"] = evaluator.results
    if not chief:
        return summary
    if stop_reason == "nan":
        raise UserInputError(
            f"Training diverged (NaN loss) at step {step}. Lower train.learning_rate_scale or "
            "raise train.warmup_steps, then train again in a fresh train.run_dir.")
    report = select_final_weights(cfg, model, tokenizer, pairs if pairs else None,
                                  stream=stream)
    chosen = report["candidates"][report["chosen"]]
    summary.update({"final_weights": report["final_weights"], "averaging": report,
                    "dev_bleu": chosen.get("bleu"), "dev_chrf": chosen.get("chrf")})
    cb._atomic_write_text(state_path, json.dumps({"status": "complete", "summary": summary},
                                                 indent=2, ensure_ascii=False))
    for d in run_dir.glob("backup*"):
        shutil.rmtree(d, ignore_errors=True)
    return summary


def _weights_have_nan(model: keras.Model) -> bool:
    return any(not np.all(np.isfinite(keras.ops.convert_to_numpy(v)))
               for v in model.trainable_weights)
