"""Translating and scoring: the served graph on a list of sentences, and sacreBLEU.

Dev BLEU during training, the choice of final weights, ``aiayn evaluate`` and the TFX
evaluation all translate with :func:`translate_sentences`, which runs the export's own
:class:`~aiayn.export.saved_model.Translator` (the functions the SavedModel stores: the one
source featuriser, the one input limit, beam search and detokenisation in one graph). So the
BLEU in the README is the BLEU of the model TF Serving runs.

    translator = make_translator(cfg, model, tokenizer)
    hypotheses = translate_sentences(translator, sources, batch_size=cfg.decode.batch_size)
    score(hypotheses, references, metric_settings_for(cfg))  # {"bleu", "chrf", signatures}
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from aiayn.export.saved_model import ServingOptions, Translator
from aiayn.models.tokenizer import SubwordTokenizer
from aiayn.pipeline.config import Config
from aiayn.pipeline.training.metrics import MetricSettings, metric_settings, score_corpus

# One Translator (one traced graph) per model and settings; weak so models can be freed.
_TRANSLATORS: weakref.WeakKeyDictionary[keras.Model, dict] = weakref.WeakKeyDictionary()


def serving_options(cfg: Config) -> ServingOptions:
    """The export's options from the config: the settings of the served graph."""
    return ServingOptions.from_configs(cfg.decode, cfg.export)


def make_translator(cfg: Config, model: keras.Model, tokenizer: SubwordTokenizer) -> Translator:
    """The served graph's Translator for ``model``, cached per model and settings.

    Over-long inputs are truncated here even when the export rejects them
    (``export.on_long_input=reject``): a served model refuses those, so there is no served
    translation to match, and a test set must still be scored whole.
    """
    options = dataclasses.replace(serving_options(cfg), on_long_input="truncate")
    per_model = _TRANSLATORS.setdefault(model, {})
    key = (options, id(tokenizer))
    if key not in per_model:
        per_model[key] = Translator(model, tokenizer, options)
    return per_model[key]


def translate_sentences(translator: Translator, sentences: Sequence[str], batch_size: int = 32,
                        return_scores: bool = False):
    """Translates ``sentences`` with the served graph; returns strings in input order.

    Sentences are sorted by token count into batches of ``batch_size`` (less padding, less
    wasted search), each batch goes through the exported ``serving_default`` function, and the
    results are put back in input order.

    Args:
      translator: from :func:`make_translator`.
      sentences: source strings.
      batch_size: sentences per batch (``decode.batch_size``).
      return_scores: also return each translation's score.

    Returns:
      ``list[str]`` (and ``list[float]`` scores when ``return_scores``).

    Example:
      >>> translate_sentences(make_translator(cfg, model, tok), ["In the beginning"])
      ['En el principio']
    """
    sentences = [str(s) for s in sentences]
    out: list[str] = [""] * len(sentences)
    scores: list[float] = [0.0] * len(sentences)
    if sentences:
        lengths = translator.tokenizer.tokenize(tf.constant(sentences)).row_lengths().numpy()
        order = np.argsort(lengths, kind="stable")
        batch_size = max(1, int(batch_size))
        for start in range(0, len(sentences), batch_size):
            idx = order[start:start + batch_size]
            result = translator.translate([sentences[i] for i in idx])
            for j, i in enumerate(idx):
                out[i] = result["translation"][j].decode("utf-8")
                scores[i] = float(result["score"][j])
    return (out, scores) if return_scores else out


def score(hypotheses: Sequence[str], references: Sequence[str],
          settings: MetricSettings | None = None) -> dict[str, Any]:
    """sacreBLEU corpus BLEU and chrF, with their signatures.

    Args:
      hypotheses, references: one string per sentence.
      settings: the target language's settings, ``metrics.metric_settings_for(cfg)`` (the tokenizer
        BLEU needs depends on the target language); None: sacreBLEU's defaults (13a).
    """
    return score_corpus(hypotheses, references, settings or metric_settings("en"))
