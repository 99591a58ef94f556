"""`aiayn evaluate`: translate a prepared split with the served graph, score it with sacreBLEU.

    report = evaluate_run(cfg, split="test")          # uses <run_dir>/final.weights.h5
    report["bleu"], report["chrf"], report["bleu_signature"]

Translation goes through :func:`aiayn.pipeline.training.validation.translate_sentences`, i.e. the
export's own graph functions (one featuriser, one input limit), in float32: the scores describe
what TF Serving runs. Files written into the run directory:

    eval/<split>.hyp.txt     one detokenised hypothesis per line, in the split's order
    eval/<split>.json        scores, sacreBLEU signatures, decode settings, timing, samples
"""

from __future__ import annotations

import time
from typing import Any

from aiayn.pipeline.config import Config
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.training.artifacts import load_trained_model, read_split
from aiayn.pipeline.training.metrics import metric_settings_for
from aiayn.pipeline.training.split_report import report_line, write_split_report
from aiayn.pipeline.training.validation import make_translator, translate_sentences

SPLITS = ("dev", "test")


def evaluate_run(cfg: Config, split: str = "dev", weights: str | None = None,
                 max_sentences: int = 0) -> dict[str, Any]:
    """Translates a prepared split, scores it and writes hypotheses and a JSON report.

    Args:
      cfg: the run configuration (model, decode, data and run directory).
      split: ``dev`` or ``test``.
      weights: a ``.weights.h5`` file; default ``<run_dir>/final.weights.h5``.
      max_sentences: score only the first N pairs (0 = all).

    Returns:
      The report: ``bleu``, ``chrf``, ``bleu_signature``, ``chrf_signature``,
      ``bleu_tokenize`` and ``metric_settings`` (chosen by ``data.target_lang``:
      :func:`aiayn.pipeline.training.metrics.metric_settings`), ``sentences``, ``seconds``,
      ``sentences_per_second``, ``weights``, ``decode``, ``hypotheses_path`` and ``samples``
      (three source/reference/hypothesis dicts).

    Raises:
      UserInputError: an unknown split, or missing data, vocabulary or weights.
    """
    if split not in SPLITS:
        raise UserInputError(f"--split must be one of {', '.join(SPLITS)}; got {split!r}.")
    began = time.monotonic()
    pairs = read_split(cfg, split)
    if max_sentences:
        pairs = pairs[:max_sentences]
    metric_settings_for(cfg)  # before translating: a missing segmenter fails fast
    model, tokenizer, weights_path = load_trained_model(cfg, weights)
    start = time.monotonic()
    hypotheses = translate_sentences(make_translator(cfg, model, tokenizer),
                                     [s for s, _ in pairs], batch_size=cfg.decode.batch_size)
    translated = time.monotonic()
    report = write_split_report(cfg, split, pairs, hypotheses, translated - start, weights_path)
    # The phases around the translation: a stage that takes far longer than its `seconds`
    # says where the rest went (a slow model load, a stalled write).
    print(f"{report_line(report)}\n  reading the split and loading the model {start - began:.1f}s,"
          f" scoring and writing {time.monotonic() - translated:.1f}s", flush=True)
    return report

