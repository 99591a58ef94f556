"""`aiayn export`: the run's final weights -> a verified, versioned serving SavedModel.

    path = export_run(cfg)   # <export.base_dir>/<export.model_name>/<version>/

Reads ``<train.run_dir>/final.weights.h5`` and the vocabulary at ``vocab_path(cfg)``, writes the
export with :func:`aiayn.export.saved_model.export_saved_model` (resolved config, SentencePiece
model, evaluation scores and the model card ``model_card.md`` in ``assets.extra/``, warmup
requests for the length buckets, ``models.config`` and ``batching_parameters.txt`` beside the
versions), and verifies it in a fresh process (stock ops only, both signatures agree with
in-process translation) BEFORE it is renamed into place: a watching server never sees a version
that failed verification.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.export import saved_model as sm
from aiayn.export.verify import VerificationError, verify_export
from aiayn.pipeline.config import Config, config_text
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.release.command_lines import aiayn_command
from aiayn.pipeline.release.model_card import export_card_path, write_model_card
from aiayn.pipeline.training.artifacts import RunFiles, load_trained_model

log = logging.getLogger(__name__)


def _eval_scores(cfg: Config) -> dict[str, Any] | None:
    """Scores written by `aiayn evaluate` (``<run_dir>/eval/<split>.json``), if any."""
    eval_dir = RunFiles.of(cfg).eval_dir
    scores = {}
    for path in sorted(eval_dir.glob("*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        keep = {k: v for k, v in report.items() if k not in ("samples",)}
        scores[path.stem] = keep
    return scores or None


def export_model(cfg: Config, model: Any, tokenizer: Any, verify: bool = True,
                 eval_scores: dict[str, Any] | None = None) -> Path:
    """Exports an in-memory model with ``cfg``'s decode/export settings; verifies first."""
    options = sm.ServingOptions.from_configs(cfg.decode, cfg.export)

    def check(tmp_dir: Path) -> None:
        report = verify_export(tmp_dir)
        log.info("Verified %s: %s", tmp_dir, report.summary())
        report.raise_if_failed()

    def before_publish(tmp_dir: Path) -> None:
        write_card(cfg, model, tokenizer, tmp_dir, eval_scores)
        if verify:
            check(tmp_dir)

    path = sm.export_saved_model(
        model, tokenizer, cfg.export.base_dir, cfg.export.model_name, options=options,
        version=cfg.export.version, config_yaml=config_text(cfg), eval_scores=eval_scores,
        bucket_boundaries=cfg.data.bucket_boundaries, before_publish=before_publish)
    return path


def write_card(cfg: Config, model: Any, tokenizer: Any, export_dir: Path,
               eval_scores: dict[str, Any] | None = None) -> Path:
    """Writes ``<export_dir>/assets.extra/model_card.md`` (the export's temporary dir is named
    ``.tmp-<version>-<id>``, so the card can name the version it will be published as)."""
    match = re.match(r"^\.tmp-(\d+)-", export_dir.name) or re.match(r"^(\d+)$", export_dir.name)
    path = export_card_path(export_dir)
    parameters = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    write_model_card(cfg, path, parameters=parameters,
                     vocabulary_size=int(tokenizer.vocabulary_size),
                     eval_reports=eval_scores if eval_scores is not None else {},
                     export_info={"model_name": cfg.export.model_name,
                                  "version": int(match.group(1)) if match else None})
    return path


def export_run(cfg: Config, weights: str | None = None, verify: bool = True) -> Path:
    """Exports the run's final weights as the next version under ``cfg.export.base_dir``.

    Args:
      cfg: the run configuration (model, decode, export, data sections are used).
      weights: a ``.weights.h5`` file; default ``<train.run_dir>/final.weights.h5``.
      verify: run the fresh-process verifier before publishing the version.

    Returns:
      The version directory, e.g. ``exports/translate/3``.

    Raises:
      UserInputError: no weights or vocabulary yet, a version that exists, a bad option.
      aiayn.export.verify.VerificationError: the export failed verification (nothing published).
    """
    try:  # float32: portable, served on any CPU
        model, tokenizer, _ = load_trained_model(cfg, weights, dtype="float32")
    except ValueError as err:
        if isinstance(err, UserInputError):
            raise
        raise UserInputError(f"The weights do not match the model config {cfg.model}: {err}. "
                             "Export with the run's own preset and --set overrides.") from err
    try:
        path = export_model(cfg, model, tokenizer, verify=verify, eval_scores=_eval_scores(cfg))
    except sm.ExportError as err:
        raise UserInputError(str(err)) from err
    except VerificationError as err:
        raise UserInputError(f"The export failed verification and was not published: {err}"
                             ) from err
    base = Path(cfg.export.base_dir)
    print(f"Exported {path}\nServe it with:\n  "
          + " ".join(shlex.quote(a) for a in sm.model_server_command(base)))
    return path


def export_run_ctranslate2(cfg: Config, weights: str | None = None, quantization: str = "none",
                           verify: bool = True) -> Path:
    """Exports the run's final weights as a CTranslate2 model (``aiayn export --format
    ctranslate2``): ``<export.base_dir>/ctranslate2/<export.model_name>[-<quantization>]/
    <version>/``, converted, checked (it loads and translates the sample sentences; float32
    weights must give the Keras model's greedy tokens) and renamed into place.

    Args:
      cfg: the run configuration (model, decode, export sections are used).
      weights: a ``.weights.h5`` file; default ``<train.run_dir>/final.weights.h5``.
      quantization: ``none`` (float32 as trained), ``int8``, ... (CTranslate2's names).
      verify: translate the sample sentences before publishing.

    Returns:
      The version directory.

    Raises:
      UserInputError: CTranslate2 not installed, no weights or vocabulary, a bad quantization,
        a version that exists, or a conversion that does not reproduce the model.
    """
    from aiayn.export import ctranslate2 as ct2

    try:
        ct2.import_ctranslate2()
        model, tokenizer, _ = load_trained_model(cfg, weights, dtype="float32")
        path = ct2.export_ctranslate2(
            model, tokenizer, cfg.export.base_dir, cfg.export.model_name,
            sm.ServingOptions.from_configs(cfg.decode, cfg.export), quantization=quantization,
            version=cfg.export.version, config_yaml=config_text(cfg),
            sample_texts=sm.DEFAULT_SAMPLE_TEXTS if verify else ())
    except (ct2.CTranslate2Error, sm.ExportError) as err:
        raise UserInputError(str(err)) from err
    print(f"Exported {path}\nTranslate with it:\n  "
          + aiayn_command(cfg, "translate", quantization, ["--engine", "ctranslate2",
                                                           "I love you."]))
    return path
