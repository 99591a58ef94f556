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

import dataclasses
import json
import time
from typing import Any

from aiayn.pipeline.config import Config
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_write
from aiayn.pipeline.training.artifacts import RunFiles, load_trained_model, read_split
from aiayn.pipeline.training.metrics import metric_settings_for
from aiayn.pipeline.training.validation import make_translator, score, translate_sentences

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
    pairs = read_split(cfg, split)
    if max_sentences:
        pairs = pairs[:max_sentences]
    settings = metric_settings_for(cfg)  # before translating: a missing segmenter fails fast
    model, tokenizer, weights_path = load_trained_model(cfg, weights)
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    start = time.monotonic()
    hypotheses = translate_sentences(make_translator(cfg, model, tokenizer), sources,
                                     batch_size=cfg.decode.batch_size)
    seconds = time.monotonic() - start
    report = {"split": split, "sentences": len(pairs),
              **score(hypotheses, references, settings), "metric_settings": settings.describe(),
              "seconds": round(seconds, 1),
              "sentences_per_second": round(len(pairs) / max(seconds, 1e-9), 2),
              "weights": str(weights_path), "decode": dataclasses.asdict(cfg.decode)}
    picks = sorted({0, len(pairs) // 2, len(pairs) - 1}) if pairs else []
    report["samples"] = [{"source": sources[i], "reference": references[i],
                          "hypothesis": hypotheses[i]} for i in picks]
    out_dir = RunFiles.of(cfg).eval_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    hyp_path = out_dir / f"{split}.hyp.txt"
    atomic_write(hyp_path, "".join(h.replace("\n", " ") + "\n" for h in hypotheses))
    report["hypotheses_path"] = str(hyp_path)
    atomic_write(out_dir / f"{split}.json", json.dumps(report, indent=2, ensure_ascii=False))
    print(f"{split}: BLEU {report['bleu']:.2f} chrF {report['chrf']:.2f} on {len(pairs)} "
          f"sentences ({seconds:.0f}s)\n  {report['bleu_signature']}\n  "
          f"{report['chrf_signature']}\n  {settings.describe()}", flush=True)
    return report

