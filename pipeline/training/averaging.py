"""Checkpoint averaging and the choice of the final weights (paper §6.1), scored on dev.

    average_checkpoints_for_run(cfg)   # `aiayn average`; train() calls select_final_weights

Candidates: the last checkpoint, the element-wise mean of the last ``train.average_last``, the
moving average of the weights at the last step (``train.ema_momentum``) and the best-dev weights;
each translates ``train.selection_max_sentences`` dev pairs (0: all of them)
with the served graph (``validation.translate_sentences``) and the best dev BLEU becomes
``final.weights.h5``, with every score in ``averaging.json``. The last checkpoint is the
default: another candidate replaces it only when it scores more than ``train.selection_margin``
BLEU above it, so that the noise of a dev sample does not swap the annealed end of a run for an
earlier checkpoint. Scored on the whole dev split, the kept candidate's translations are also
the final weights' dev evaluation (``eval/dev.json`` and ``dev.hyp.txt``, as ``aiayn evaluate``
writes them: :mod:`~aiayn.pipeline.training.split_report`), which ``make train`` then does not
translate again.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from aiayn.pipeline.config import Config
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_write
from aiayn.pipeline.training.artifacts import (
    RunFiles,
    build_model,
    dev_sample,
    list_checkpoints,
    load_model_weights,
    load_tokenizer,
    save_model_weights,
    weights_load_error,
)
from aiayn.pipeline.training.metrics import metric_settings_for
from aiayn.pipeline.training.split_report import write_split_report
from aiayn.pipeline.training.validation import make_translator, score, translate_sentences


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
        try:
            load_model_weights(model, path)
        except (OSError, ValueError) as err:  # a damaged checkpoint, or another config's
            raise weights_load_error(path, err) from None
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


def candidate_count(cfg: Config) -> int:
    """At most how many candidates a run of ``cfg`` has: the last checkpoint, the average of the
    last N, the best-dev weights, and the weights' moving average (``train.ema_momentum``)."""
    return 3 + (cfg.train.ema_momentum > 0)


def selection_pairs(cfg: Config) -> list[tuple[str, str]]:
    """The dev pairs the candidates are scored on (``train.selection_max_sentences``)."""
    return dev_sample(cfg, cfg.train.selection_max_sentences)


def _candidates(cfg: Config, files: RunFiles) -> tuple[list, list[tuple[str, list[str]]]]:
    """The checkpoints, and the ``(name, weight files)`` candidates for the final weights."""
    ckpts = list_checkpoints(files.checkpoints)
    if not ckpts:
        raise UserInputError(f"No checkpoints in {files.checkpoints}: train first with "
                             "`aiayn train`.")
    last_n = [str(p) for _, p in ckpts[-max(1, cfg.train.average_last):]]
    candidates = [("last", [str(ckpts[-1][1])])]
    if len(last_n) > 1:
        candidates.append((f"average_last_{len(last_n)}", last_n))
    ema = files.ema(ckpts[-1][0])
    if ema.exists():  # written at the last step only: a stale one never matches
        candidates.append(("ema", [str(ema)]))
    if files.best.exists() and files.dev_eval_state.exists():
        best_step = json.loads(files.dev_eval_state.read_text()).get("best_step", -1)
        if best_step != ckpts[-1][0]:
            candidates.append((f"best_dev_step_{best_step}", [str(files.best)]))
    return ckpts, candidates


def _score_on_dev(cfg: Config, model: keras.Model, tokenizer,
                  pairs: Sequence[tuple[str, str]]) -> tuple[dict[str, Any], list[str]]:
    """A candidate's scores on ``pairs`` (with the seconds its translation took), and its
    translations."""
    start = time.monotonic()
    hyps = translate_sentences(make_translator(cfg, model, tokenizer), [s for s, _ in pairs],
                               batch_size=cfg.decode.batch_size)
    scores = score(hyps, [t for _, t in pairs], metric_settings_for(cfg))
    entry = {k: v for k, v in scores.items() if k != "bleu_detail"}
    entry["seconds"] = round(time.monotonic() - start, 1)
    return entry, hyps


def _covers_dev(cfg: Config, pairs: Sequence[tuple[str, str]]) -> bool:
    """Whether ``pairs`` are the whole dev split, in its order (what ``aiayn evaluate`` scores)."""
    return bool(pairs) and list(pairs) == dev_sample(cfg, 0)


def select_final_weights(cfg: Config, model: keras.Model, tokenizer,
                         pairs: Sequence[tuple[str, str]] | None = None,
                         stream=None) -> dict[str, Any]:
    """Scores the last checkpoint, the average of the last N, the moving average and the best-dev
    weights on dev (``pairs``; default :func:`selection_pairs`).

    The best of them (another than the last only when it beats the last by more than
    ``train.selection_margin`` BLEU) is written to ``<run_dir>/final.weights.h5``; all scores go to
    ``<run_dir>/averaging.json``. Without dev data the average (or the last) is kept unscored.

    Returns:
      The averaging report (candidates with their BLEU/chrF, ``chosen``), and, when ``pairs``
      are the whole dev split, ``dev_evaluation``: the final weights' ``eval/dev.json`` report
      (not in ``averaging.json``).

    Raises:
      UserInputError: the run has no checkpoints.
    """
    stream = stream or sys.stdout
    files = RunFiles.of(cfg)
    ckpts, candidates = _candidates(cfg, files)
    if pairs is None:
        pairs = selection_pairs(cfg)
    report: dict[str, Any] = {"checkpoints": [str(p) for _, p in ckpts],
                              "average_last": min(len(ckpts), max(1, cfg.train.average_last)),
                              "dev_sentences": len(pairs),
                              "selection_margin": cfg.train.selection_margin, "candidates": {}}
    best_name, best_bleu, last_bleu = None, -1.0, None
    translations: dict[str, list[str]] = {}
    for name, weight_files in candidates:
        average_weight_files(model, weight_files)
        entry: dict[str, Any] = {"files": weight_files}
        if pairs:
            scores, translations[name] = _score_on_dev(cfg, model, tokenizer, pairs)
            entry.update(scores)
            stream.write(f"dev {name}: BLEU {entry['bleu']:.2f} chrF {entry['chrf']:.2f}\n")
            stream.flush()
            if name == "last":  # always the first candidate
                last_bleu = entry["bleu"]
            better = entry["bleu"] > best_bleu and (
                name == "last" or entry["bleu"] - last_bleu > cfg.train.selection_margin)
        else:
            better = best_name is None or name.startswith("average")
        report["candidates"][name] = entry
        if better:
            best_name, best_bleu = name, entry.get("bleu", -1.0)
    report["chosen"] = best_name
    average_weight_files(model, report["candidates"][best_name]["files"])
    final = save_model_weights(model, files.final)
    report["final_weights"] = str(final)
    atomic_write(files.averaging, json.dumps(report, indent=2, ensure_ascii=False))
    if best_name in translations and _covers_dev(cfg, pairs):
        # The final weights' dev evaluation, as `aiayn evaluate --split dev` writes it: the
        # same graph has just translated the whole split with these weights.
        report["dev_evaluation"] = write_split_report(
            cfg, "dev", pairs, translations[best_name],
            report["candidates"][best_name]["seconds"], final)
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
