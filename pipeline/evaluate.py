"""Translate a split with the decode config and score it with sacreBLEU (BLEU and chrF).

    report = evaluate_run(cfg, split="test")          # uses <run_dir>/final.weights.h5
    report["bleu"], report["chrf"], report["bleu_signature"]

Files written into the run directory:

    eval/<split>.hyp.txt     one detokenised hypothesis per line, in the split's order
    eval/<split>.json        scores, sacreBLEU signatures, decode settings, timing, samples

Library helpers shared with training: :func:`build_model` (the Transformer from the config and
the tokenizer, built on a dummy batch so weights can load) and :func:`translate_sentences`
(batched beam search in a ``tf.function``; results in input order).
"""

from __future__ import annotations

import dataclasses
import json
import time
import weakref
from pathlib import Path
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from aiayn.pipeline.fileio import atomic_write
from aiayn.pipeline.config import Config, DecodeConfig
from aiayn.pipeline.errors import UserInputError

FINAL_WEIGHTS = "final.weights.h5"


def load_tokenizer(cfg: Config):
    """The run's :class:`SubwordTokenizer` (``<data_dir>/spm.model``).

    Raises:
      UserInputError: the vocabulary has not been built yet.
    """
    from aiayn.models.tokenizer import SubwordTokenizer
    from aiayn.pipeline.vocab import vocab_path

    path = vocab_path(cfg)
    if not Path(path).exists():
        raise UserInputError(f"{path} not found: build the vocabulary first with `aiayn vocab` "
                             "(or `make train`).")
    return SubwordTokenizer.from_file(path)


def dummy_features(batch: int = 1, length: int = 4) -> dict[str, np.ndarray]:
    ids = np.full((batch, length), 4, dtype="int32")
    mask = np.ones((batch, length), dtype=bool)
    return {"encoder_token_ids": ids, "encoder_padding_mask": mask,
            "decoder_token_ids": ids, "decoder_padding_mask": mask}


def build_model(cfg: Config, tokenizer, dtype: str | None = None) -> keras.Model:
    """The Transformer of ``cfg.model`` for ``tokenizer``'s vocabulary, with its weights built.

    Args:
      cfg: the run configuration.
      tokenizer: the run's ``SubwordTokenizer`` (vocabulary size and pad id).
      dtype: a Keras dtype policy name; None = the global policy (training sets it). Evaluation
        and export pass ``"float32"``: the scores then describe exactly what is served, on any
        CPU (variables are float32 under every mixed policy, so weights load either way).
    """
    from aiayn.models.transformer import Transformer

    model = Transformer(vocabulary_size=tokenizer.vocabulary_size, pad_id=tokenizer.pad_id,
                        dtype=dtype, **dataclasses.asdict(cfg.model))
    model(dummy_features(), training=False)
    return model


# One traced generate function per (model, decode settings); weak so models can be freed.
_GENERATE_CACHE: "weakref.WeakKeyDictionary[keras.Model, dict]" = weakref.WeakKeyDictionary()


def _generate_fn(model, tokenizer, decode_cfg: DecodeConfig, n_best: int = 1):
    key = (decode_cfg.beam_size, decode_cfg.length_penalty, decode_cfg.max_extra_length, n_best,
           tokenizer.bos_id, tokenizer.eos_id)
    per_model = _GENERATE_CACHE.setdefault(model, {})
    if key not in per_model:
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32),
                                      tf.TensorSpec([None, None], tf.bool)])
        def generate(ids, mask):
            return model.generate(ids, mask, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                                  beam_size=decode_cfg.beam_size,
                                  length_penalty=decode_cfg.length_penalty,
                                  max_extra_length=decode_cfg.max_extra_length, n_best=n_best)
        per_model[key] = generate
    return per_model[key]


def translate_sentences(model, tokenizer, sentences: Sequence[str], decode_cfg: DecodeConfig,
                        max_length: int = 256, return_scores: bool = False):
    """Translates ``sentences`` with beam search (``decode_cfg``); returns strings in input order.

    Sentences are sorted by length into batches of ``decode_cfg.batch_size`` (less padding, less
    wasted search), translated by ``model.generate`` inside one traced ``tf.function`` (shape
    ``[None, None]``, so every batch reuses the trace), detokenised in-graph, and put back in
    input order.

    Args:
      model: a built Transformer with ``generate``.
      tokenizer: the run's ``SubwordTokenizer``.
      sentences: source strings.
      decode_cfg: beam size, length penalty, max extra length, batch size.
      max_length: sources are truncated to this many subword tokens.
      return_scores: also return the best hypothesis' score per sentence.

    Returns:
      ``list[str]`` (and ``list[float]`` scores when ``return_scores``).

    Example:
      >>> translate_sentences(model, tok, ["In the beginning"], cfg.decode)
      ['En el principio']
    """
    sentences = [str(s) for s in sentences]
    n = len(sentences)
    out: list[str] = [""] * n
    scores: list[float] = [0.0] * n
    if n == 0:
        return (out, scores) if return_scores else out
    generate = _generate_fn(model, tokenizer, decode_cfg)
    # Tokenise once to sort by real length: batches of similar length pad little.
    pieces = tokenizer.tokenize(tf.constant(sentences))
    lengths = pieces.row_lengths().numpy()
    order = np.argsort(lengths, kind="stable")
    batch_size = max(1, int(decode_cfg.batch_size))
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        rows = tf.gather(pieces, idx)[:, :max_length]
        ids = rows.to_tensor(default_value=tokenizer.pad_id)
        if ids.shape[1] == 0:
            ids = tf.fill([len(idx), 1], tokenizer.pad_id)
        ids = tf.cast(ids, tf.int32)
        mask = tf.sequence_mask(rows.row_lengths(), maxlen=tf.shape(ids)[1])
        result = generate(ids, mask)
        best = result["token_ids"][:, 0, :]  # (batch, length)
        texts = tokenizer.detokenize(best).numpy()
        best_scores = result["scores"][:, 0].numpy()
        for j, i in enumerate(idx):
            out[i] = texts[j].decode("utf-8")
            scores[i] = float(best_scores[j])
    return (out, scores) if return_scores else out


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """sacreBLEU corpus BLEU and chrF, with their signatures."""
    import sacrebleu

    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return {"bleu": round(float(b.score), 2), "chrf": round(float(c.score), 2),
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()), "bleu_detail": str(b)}


def read_pairs(cfg: Config, split: str) -> list[tuple[str, str]]:
    from aiayn.pipeline.train import read_pairs, split_file

    path = split_file(cfg, split)
    if not path.exists():
        raise UserInputError(f"{path} not found: prepare the data first with `aiayn data`.")
    return read_pairs(path)


def resolve_weights(cfg: Config, weights: str | None) -> Path:
    path = Path(weights) if weights else Path(cfg.train.run_dir) / FINAL_WEIGHTS
    if not path.exists():
        raise UserInputError(
            f"Weights file {path} not found: train first (`aiayn train`) or pass --weights "
            "with a .weights.h5 file of this run.")
    return path


def evaluate_run(cfg: Config, split: str = "dev", weights: str | None = None,
                 max_sentences: int = 0) -> dict[str, Any]:
    """Translates a prepared split, scores it and writes hypotheses and a JSON report.

    Args:
      cfg: the run configuration (model, decode, data and run directory).
      split: ``dev`` or ``test``.
      weights: a ``.weights.h5`` file; default ``<run_dir>/final.weights.h5``.
      max_sentences: score only the first N pairs (0 = all).

    Returns:
      The report: ``bleu``, ``chrf``, ``bleu_signature``, ``chrf_signature``, ``sentences``,
      ``seconds``, ``sentences_per_second``, ``weights``, ``decode``, ``hypotheses_path`` and
      ``samples`` (three source/reference/hypothesis dicts).

    Raises:
      UserInputError: an unknown split, or missing data, vocabulary or weights.
    """
    if split not in ("train", "dev", "test"):
        raise UserInputError(f"split must be dev or test; got {split!r}.")
    from aiayn.pipeline.callbacks import load_model_weights

    weights_path = resolve_weights(cfg, weights)
    tokenizer = load_tokenizer(cfg)
    pairs = read_pairs(cfg, split)
    if max_sentences:
        pairs = pairs[:max_sentences]
    model = build_model(cfg, tokenizer, dtype="float32")
    load_model_weights(model, weights_path)
    sources = [s for s, _ in pairs]
    references = [t for _, t in pairs]
    start = time.monotonic()
    hypotheses = translate_sentences(model, tokenizer, sources, cfg.decode,
                                     max_length=cfg.data.max_length)
    seconds = time.monotonic() - start
    report = {"split": split, "sentences": len(pairs), **score(hypotheses, references),
              "seconds": round(seconds, 1),
              "sentences_per_second": round(len(pairs) / max(seconds, 1e-9), 2),
              "weights": str(weights_path), "decode": dataclasses.asdict(cfg.decode)}
    picks = sorted({0, len(pairs) // 2, len(pairs) - 1}) if pairs else []
    report["samples"] = [{"source": sources[i], "reference": references[i],
                          "hypothesis": hypotheses[i]} for i in picks]
    out_dir = Path(cfg.train.run_dir) / "eval"
    out_dir.mkdir(parents=True, exist_ok=True)
    hyp_path = out_dir / f"{split}.hyp.txt"
    _write_text(hyp_path, "".join(h.replace("\n", " ") + "\n" for h in hypotheses))
    report["hypotheses_path"] = str(hyp_path)
    _write_text(out_dir / f"{split}.json", json.dumps(report, indent=2, ensure_ascii=False))
    print(f"{split}: BLEU {report['bleu']:.2f} chrF {report['chrf']:.2f} on {len(pairs)} "
          f"sentences ({seconds:.0f}s)\n  {report['bleu_signature']}\n  "
          f"{report['chrf_signature']}", flush=True)
    return report


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, text)
