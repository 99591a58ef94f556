"""Dev-set BLEU during training: the best checkpoint and early stopping.

:class:`DevEvaluator` translates a fixed dev sample every ``train.eval_every`` steps with the
served graph (``validation.translate_sentences``), scores it with sacreBLEU (the target
language's settings, :mod:`aiayn.pipeline.training.metrics`), keeps the best
weights in ``best.weights.h5`` and stops training after ``train.early_stopping_patience``
evaluations without improvement.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import keras
import tensorflow as tf

from aiayn.pipeline.fileio import atomic_write
from aiayn.pipeline.training.artifacts import save_model_weights
from aiayn.pipeline.training.callbacks import RunHistory, current_step
from aiayn.pipeline.training.metrics import MetricSettings, metric_settings

log = logging.getLogger(__name__)


class DevEvaluator(keras.callbacks.Callback):
    """Scores dev translations with sacreBLEU every ``every`` steps; tracks the best; stops early.

    Args:
      translate_fn: ``translate_fn(sources) -> list[str]`` with the current model (for training:
        :func:`aiayn.pipeline.training.validation.translate_sentences` with the decode config).
      sources, references: the dev pairs (already limited to ``eval_max_sentences``).
      every: evaluate when the optimizer step is a multiple of this (0 = never during training).
      best_path: where the best weights are written (``None``: not written).
      patience: stop after this many evaluations without a BLEU gain (0 = never stop).
      history: a :class:`RunHistory` receiving ``dev_bleu`` / ``dev_chrf`` at the step.
      state_path: JSON file holding best score and patience counter across restarts.
      evaluate_at_end: also evaluate the final step if it was not just evaluated.
      skip_if: no evaluation (hence no best weights) while it returns true (a diverged run).
      metrics: the target language's sacreBLEU settings (``metrics.metric_settings_for(cfg)``);
        None: sacreBLEU's defaults (13a).

    Attributes:
      best_bleu, best_step, results (list of dicts with step, bleu, chrf, seconds).
    """

    def __init__(self, translate_fn: Callable[[Sequence[str]], list[str]],
                 sources: Sequence[str], references: Sequence[str], every: int,
                 best_path: str | os.PathLike | None = None, patience: int = 0,
                 history: RunHistory | None = None, state_path: str | os.PathLike | None = None,
                 summary_dir: str | os.PathLike | None = None, evaluate_at_end: bool = False,
                 write: bool = True, stream=None, skip_if: Callable[[], bool] | None = None,
                 metrics: MetricSettings | None = None):
        super().__init__()
        if len(sources) != len(references):
            raise ValueError(f"{len(sources)} dev sources but {len(references)} references.")
        self.translate_fn = translate_fn
        self.sources = list(sources)
        self.references = list(references)
        self.every = int(every)
        self.best_path = Path(best_path) if best_path else None
        self.patience = int(patience)
        self.history = history
        self.state_path = Path(state_path) if state_path else None
        self.summary_dir = summary_dir
        self.evaluate_at_end = evaluate_at_end
        self.write = write
        self.stream = stream or sys.stdout
        self.skip_if = skip_if
        self.metrics = metrics or metric_settings("en")
        self.best_bleu = -1.0
        self.best_step = -1
        self.bad_evals = 0
        self.results: list[dict] = []
        self.stopped_early = False
        self._last_eval_step = -1
        self.writer = None

    def on_train_begin(self, logs=None):
        step = current_step(self.model)
        if self.state_path and self.state_path.exists():
            state = json.loads(self.state_path.read_text())
            self.results = [r for r in state.get("results", []) if r["step"] <= step]
            self._recompute_best()
        if self.best_path and self.best_step < 0 and self.best_path.exists() and self.write:
            self.best_path.unlink()
        if self.summary_dir:
            self.writer = tf.summary.create_file_writer(str(self.summary_dir))
        self._last_eval_step = step if self.results and self.results[-1]["step"] == step else -1

    def _recompute_best(self) -> None:
        self.best_bleu, self.best_step, self.bad_evals = -1.0, -1, 0
        for r in self.results:
            if r["bleu"] > self.best_bleu:
                self.best_bleu, self.best_step, self.bad_evals = r["bleu"], r["step"], 0
            else:
                self.bad_evals += 1

    def score(self, hypotheses: Sequence[str]) -> dict:
        bleu, chrf = self.metrics.bleu(), self.metrics.chrf()
        return {"bleu": float(bleu.corpus_score(list(hypotheses), [self.references]).score),
                "chrf": float(chrf.corpus_score(list(hypotheses), [self.references]).score)}

    def evaluate(self, step: int) -> dict:
        """Translates the dev sources now; records, saves best, updates patience."""
        start = time.monotonic()
        hyps = self.translate_fn(self.sources)
        result = {"step": int(step), **self.score(hyps),
                  "seconds": round(time.monotonic() - start, 2)}
        self._last_eval_step = step
        self.results.append(result)
        improved = result["bleu"] > self.best_bleu
        if improved:
            self.best_bleu, self.best_step, self.bad_evals = result["bleu"], step, 0
            if self.best_path is not None and self.write:
                save_model_weights(self.model, self.best_path)
        else:
            self.bad_evals += 1
        if self.history is not None:
            self.history.add(step, dev_bleu=result["bleu"], dev_chrf=result["chrf"])
            self.history.save()
        if self.writer is not None:
            with self.writer.as_default(step=step):
                tf.summary.scalar("dev_bleu", result["bleu"])
                tf.summary.scalar("dev_chrf", result["chrf"])
            self.writer.flush()
        if self.state_path is not None and self.write:
            atomic_write(self.state_path, json.dumps(
                {"results": self.results, "best_bleu": self.best_bleu,
                 "best_step": self.best_step}, indent=1))
        self.stream.write(
            f"dev @ step {step}: BLEU {result['bleu']:.2f} chrF {result['chrf']:.2f} "
            f"({result['seconds']:.0f}s; best {self.best_bleu:.2f} @ {self.best_step})\n")
        if hyps:
            self.stream.write(f"  e.g. {self.sources[0]!r} -> {hyps[0]!r}\n")
        self.stream.flush()
        if self.patience and self.bad_evals >= self.patience:
            self.stopped_early = True
            self.model.stop_training = True
            self.stream.write(f"early stopping: no dev BLEU gain in {self.patience} "
                              f"evaluation(s); best {self.best_bleu:.2f} at step "
                              f"{self.best_step}.\n")
        return result

    def _skipped(self) -> bool:
        return self.skip_if is not None and self.skip_if()

    def on_train_batch_end(self, batch, logs=None):
        if self.every <= 0 or self._skipped():
            return
        step = current_step(self.model)
        if step > 0 and step % self.every == 0 and step != self._last_eval_step:
            self.evaluate(step)

    def on_train_end(self, logs=None):
        step = current_step(self.model)
        if (self.evaluate_at_end and step != self._last_eval_step and step > 0
                and not self._skipped()):
            self.evaluate(step)
        if self.writer is not None:
            self.writer.close()
