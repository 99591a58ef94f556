"""The scored translation of a split: ``eval/<split>.json`` and ``eval/<split>.hyp.txt``.

``aiayn evaluate`` writes them after translating a split; the choice of the final weights
writes the dev split's when it has just translated all of it with the weights it keeps (the
same served graph, the same weights: the same translations), so that ``make train`` does not
translate the dev split twice.

    report = write_split_report(cfg, "dev", pairs, hypotheses, seconds, weights_path)
    report["bleu"], report["hypotheses_path"], report["samples"]
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from aiayn.pipeline.config import Config
from aiayn.pipeline.fileio import atomic_write
from aiayn.pipeline.training.artifacts import RunFiles
from aiayn.pipeline.training.metrics import length_by_reference, metric_settings_for
from aiayn.pipeline.training.validation import score


def split_report(cfg: Config, split: str, pairs: Sequence[tuple[str, str]],
                 hypotheses: Sequence[str], seconds: float,
                 weights_path: str | os.PathLike) -> dict[str, Any]:
    """Scores ``hypotheses`` against the split's references.

    Returns:
      ``split``, ``sentences``, ``bleu``, ``chrf``, their signatures and ``bleu_detail``,
      ``length_by_reference`` (the output's length in five groups of the references, shortest
      first: :func:`aiayn.pipeline.training.metrics.length_by_reference`),
      ``metric_settings``, ``seconds``, ``sentences_per_second``, ``weights``, ``decode`` and
      ``samples`` (the first, middle and last pairs with their hypotheses).
    """
    if len(hypotheses) != len(pairs):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(pairs)} {split} pairs.")
    settings = metric_settings_for(cfg)
    references = [t for _, t in pairs]
    report = {"split": split, "sentences": len(pairs),
              **score(hypotheses, references, settings),
              "length_by_reference": length_by_reference(hypotheses, references, settings),
              "metric_settings": settings.describe(),
              "seconds": round(seconds, 1),
              "sentences_per_second": round(len(pairs) / max(seconds, 1e-9), 2),
              "weights": str(weights_path), "decode": dataclasses.asdict(cfg.decode)}
    picks = sorted({0, len(pairs) // 2, len(pairs) - 1}) if pairs else []
    report["samples"] = [{"source": pairs[i][0], "reference": pairs[i][1],
                          "hypothesis": hypotheses[i]} for i in picks]
    return report


def write_split_report(cfg: Config, split: str, pairs: Sequence[tuple[str, str]],
                       hypotheses: Sequence[str], seconds: float,
                       weights_path: str | os.PathLike) -> dict[str, Any]:
    """:func:`split_report`, written (atomically) to ``<run_dir>/eval/<split>.json`` with the
    hypotheses, one per line in the split's order, in ``<run_dir>/eval/<split>.hyp.txt``.

    Returns:
      The report, with ``hypotheses_path``.
    """
    report = split_report(cfg, split, pairs, hypotheses, seconds, weights_path)
    out_dir = RunFiles.of(cfg).eval_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    hyp_path = out_dir / f"{split}.hyp.txt"
    atomic_write(hyp_path, "".join(h.replace("\n", " ") + "\n" for h in hypotheses))
    report["hypotheses_path"] = str(hyp_path)
    atomic_write(out_dir / f"{split}.json", json.dumps(report, indent=2, ensure_ascii=False))
    return report


def report_line(report: dict[str, Any]) -> str:
    """The report as the evaluate stage prints it (scores, sentences, time, signatures, the
    output's length by the reference's)."""
    line = (f"{report['split']}: BLEU {report['bleu']:.2f} chrF {report['chrf']:.2f} on "
            f"{report['sentences']} sentences ({report['seconds']:.0f}s)\n  "
            f"{report['bleu_signature']}\n  {report['chrf_signature']}\n  "
            f"{report['metric_settings']}")
    groups = report.get("length_by_reference")  # none for an empty split or a bare dict
    if groups:
        line += "\n  output/reference length, by reference tokens: " + " | ".join(
            f"{g['reference_tokens'][0]}-{g['reference_tokens'][1]} {g['length_ratio']:.3f}"
            for g in groups)
    return line
