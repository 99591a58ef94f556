"""The evaluation step of the TFX pipeline: sacreBLEU of the Trainer's SavedModel on ExampleGen's
eval split, against the last blessed model, and the blessing that gates the Pusher.

TFMA (TFX's Evaluator) computes metrics over a model's predictions on tf.Examples; corpus BLEU
of decoded translations is not one of them, so this step is a Python-function component
(pipeline/tfx/components.py: ``BleuEvaluator``), TFX's documented way for such a metric. This
module is its body and imports no TFX:

1. the first ``tfx.eval_sentences`` pairs of the eval split (ExampleGen's GZIP TFRecords);
2. each model translates them through the SavedModel's own ``serving_default`` signature, the
   graph the Pusher would push and TF Serving would run (sorted by length into batches of
   ``decode.batch_size``; a sentence the export refuses, ``export.on_long_input=reject``, counts
   as an empty translation, as a client would get none);
3. sacreBLEU BLEU and chrF with their signatures, with the settings dev BLEU and ``aiayn
   evaluate`` use for the target language (:func:`aiayn.pipeline.training.metrics.
   metric_settings`: ``data.target_lang``, ``train.bleu_tokenize``);
4. the baseline (the last blessed model, which TFX resolves from ML Metadata) is scored on the
   same sentences, and :func:`aiayn.pipeline.tfx.blessing.decide` applies the floor and margin;
5. ``evaluation.json`` (metrics, signatures, reason, a few translations) and ``BLESSED`` or
   ``NOT_BLESSED`` are written into the blessing artifact's directory.

Example (what the component runs)::

    result = evaluate_and_bless(eval_patterns=[".../Split-eval/*"],
                                model_dir=".../Trainer/model/7/Format-Serving",
                                baseline_dir=None, output_dir=".../BleuEvaluator/blessing/9",
                                floor=1.0, margin=1.0, eval_sentences=500, batch_size=64,
                                target_lang="es", bleu_tokenize="auto")
    result["blessed"], result["reason"], result["bleu"]
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.tfx import blessing
from aiayn.pipeline.tfx.trainer import read_split

SERVING_SIGNATURE = "serving_default"
# Translations kept in evaluation.json for a reader (the rest only count in the scores).
EXAMPLES_KEPT = 5


def translate_export(export_dir: str, sentences: Sequence[str], batch_size: int = 64
                     ) -> tuple[list[str], int]:
    """Translates ``sentences`` with a SavedModel's ``serving_default`` signature.

    Args:
      export_dir: a serving SavedModel directory (the Trainer's ``Format-Serving``).
      sentences: source strings.
      batch_size: sentences per call (sorted by length first: less padding).

    Returns:
      ``(translations in input order, how many inputs the export refused)``; a refused input
      (over-long under ``export.on_long_input=reject``) translates to ``""``.

    Raises:
      UserInputError: ``export_dir`` holds no SavedModel with a ``serving_default`` signature.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the graph uses)

    if not tf.io.gfile.exists(f"{export_dir.rstrip('/')}/saved_model.pb"):
        raise UserInputError(f"{export_dir} holds no saved_model.pb; the evaluation needs the "
                             "Trainer's serving SavedModel (Format-Serving).")
    loaded = tf.saved_model.load(export_dir)
    if SERVING_SIGNATURE not in loaded.signatures:
        raise UserInputError(f"{export_dir} has no {SERVING_SIGNATURE!r} signature (it has "
                             f"{sorted(loaded.signatures)}); re-export the model.")
    serve = loaded.signatures[SERVING_SIGNATURE]
    out = [""] * len(sentences)
    refused = 0
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    for start in range(0, len(order), max(1, int(batch_size))):
        idx = order[start:start + max(1, int(batch_size))]
        batch = [sentences[i] for i in idx]
        try:
            result = serve(text=tf.constant(batch, tf.string))["translation"].numpy()
        except tf.errors.InvalidArgumentError:  # the export refuses an over-long input:
            result = []                          # one at a time, so only that one is lost
            for text in batch:
                try:
                    result.append(serve(text=tf.constant([text], tf.string))[
                        "translation"].numpy()[0])
                except tf.errors.InvalidArgumentError:
                    result.append(b"")
                    refused += 1
        for i, value in zip(idx, result):
            out[i] = value.decode("utf-8")
    return out, refused


def score_export(export_dir: str, pairs: Sequence[tuple[str, str]], settings: Any,
                 batch_size: int = 64) -> dict[str, Any]:
    """sacreBLEU BLEU and chrF (with signatures) of one SavedModel on ``pairs``.

    Args:
      export_dir: the serving SavedModel.
      pairs: ``(source, reference)`` pairs.
      settings: :class:`aiayn.pipeline.training.metrics.MetricSettings` (the BLEU tokenizer).
      batch_size: sentences per ``serving_default`` call.

    Returns:
      :func:`aiayn.pipeline.training.metrics.score_corpus`'s dict, plus ``refused``, ``seconds``
      and ``hypotheses``.
    """
    from aiayn.pipeline.training.metrics import score_corpus

    start = time.monotonic()
    hypotheses, refused = translate_export(export_dir, [s for s, _ in pairs], batch_size)
    result = score_corpus(hypotheses, [t for _, t in pairs], settings)
    result.update(refused=refused, seconds=round(time.monotonic() - start, 1),
                  hypotheses=hypotheses)
    return result


def _write_text(uri: str, text: str) -> None:
    """Writes ``text`` to a local path (atomically) or a ``tf.io.gfile`` URI (``gs://``)."""
    if "://" in uri:
        import tensorflow as tf

        with tf.io.gfile.GFile(uri, "w") as f:
            f.write(text)
        return
    from aiayn.pipeline.fileio import atomic_write

    atomic_write(uri, text)


def write_blessing_files(output_dir: str, blessed: bool, payload: dict[str, Any],
                         files: dict[bool, str], payload_name: str) -> None:
    """The marker file (``BLESSED`` / ``NOT_BLESSED`` or the infra pair) and the JSON report."""
    base = output_dir.rstrip("/")
    if "://" not in base:
        Path(base).mkdir(parents=True, exist_ok=True)
    _write_text(f"{base}/{payload_name}",
                json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
    _write_text(f"{base}/{files[blessed]}", "")


def evaluate_and_bless(*, eval_patterns: Sequence[str], model_dir: str,
                       baseline_dir: str | None, output_dir: str, floor: float, margin: float,
                       eval_sentences: int, batch_size: int, target_lang: str,
                       bleu_tokenize: str) -> dict[str, Any]:
    """Scores the new model (and the baseline) on the eval split and decides the blessing.

    Args:
      eval_patterns: file patterns of ExampleGen's eval split (``.../Split-eval/*``).
      model_dir: the new model's serving SavedModel.
      baseline_dir: the last blessed model's serving SavedModel, or None (none blessed yet).
      output_dir: the ModelBlessing artifact's directory (local or ``gs://``).
      floor / margin: ``tfx.bleu_floor`` / ``tfx.bleu_margin`` (BLEU points).
      eval_sentences: how many eval pairs to translate (the first N); 0 = all.
      batch_size: sentences per ``serving_default`` call.
      target_lang / bleu_tokenize: ``data.target_lang`` / ``train.bleu_tokenize``: which
        sacreBLEU tokenizer BLEU uses (``auto``: by the target language).

    Returns:
      ``blessed``, ``reason`` and the metrics (``bleu``, ``chrf``, their signatures,
      ``baseline_bleu``/``baseline_chrf`` when there is a baseline, ``eval_sentences``, ...),
      as written to ``evaluation.json``.

    Raises:
      UserInputError: bad thresholds, an empty eval split, a model directory that holds no
        SavedModel, or a BLEU tokenizer that cannot run here.
    """
    from aiayn.pipeline.training.metrics import metric_settings

    blessing.check_thresholds(floor, margin)
    settings = metric_settings(target_lang, bleu_tokenize)
    if isinstance(eval_sentences, bool) or int(eval_sentences) < 0:
        raise UserInputError(f"`tfx.eval_sentences` must be an integer >= 0 (0 = the whole eval "
                             f"split); got {eval_sentences!r}.")
    scratch = Path(tempfile.mkdtemp(prefix="aiayn-tfx-eval-"))
    try:
        pairs = read_split(list(eval_patterns), 0.0, scratch, "eval")  # 0: no ratio check
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if eval_sentences:
        pairs = pairs[:int(eval_sentences)]
    current = score_export(model_dir, pairs, settings, batch_size)
    base = score_export(baseline_dir, pairs, settings, batch_size) if baseline_dir else None
    decision = blessing.decide(current["bleu"], floor, margin,
                               None if base is None else base["bleu"])
    result: dict[str, Any] = {
        "blessed": decision.blessed, "reason": decision.reason,
        "bleu": current["bleu"], "chrf": current["chrf"],
        "bleu_signature": current["bleu_signature"],
        "chrf_signature": current["chrf_signature"], "bleu_tokenize": settings.bleu_tokenize,
        "bleu_floor": decision.floor, "bleu_margin": decision.margin,
        "eval_sentences": len(pairs), "refused": current["refused"],
        "seconds": current["seconds"], "model": model_dir,
        "examples": [{"source": s, "reference": t, "translation": h} for (s, t), h in
                     zip(pairs[:EXAMPLES_KEPT], current["hypotheses"])],
    }
    if base is not None:
        result.update(baseline_model=baseline_dir, baseline_bleu=base["bleu"],
                      baseline_chrf=base["chrf"], baseline_refused=base["refused"])
    write_blessing_files(output_dir, decision.blessed, result, blessing.MODEL_BLESSING_FILES,
                         blessing.EVALUATION_FILE)
    print(f"BleuEvaluator: {decision.reason} (BLEU {current['bleu']:.2f}, chrF "
          f"{current['chrf']:.2f} on {len(pairs)} eval sentences; {current['bleu_signature']})",
          flush=True)
    return result
