"""Seeing inside a translation: the attention maps of each head, under teacher forcing.

    data = explain_translation(model, tokenizer, "I love you.", "attention.png")  # cross-attention

Attention maps come from the model's own layers (``Transformer.attention_weights``), never from a
re-implementation: the sentence is translated with ``model.generate`` and the produced tokens are
then fed back under teacher forcing, which gives the decoder exactly the inputs it had while it
searched (BOS, then its own previous outputs). Row ``i`` of a cross-attention map is the query
that produced output token ``i``; its columns are the source subwords.

The figures are drawn by :mod:`aiayn.pipeline.evaluation.plots` (matplotlib, imported lazily).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.evaluation.plots import plot_heads

KINDS = ("encoder_self", "decoder_self", "cross")


# --------------------------------------------------------------------------------------------
# Attention under teacher forcing


def attention_maps(model: Any, tokenizer: Any, sources: Sequence[str],
                   outputs: Sequence[Sequence[int]], max_length: int = 256) -> dict[str, Any]:
    """Per-layer attention weights for source sentences and the tokens the decoder produced.

    The decoder input is ``[BOS] + outputs[:-1]`` (what the decoder saw while generating), so row
    ``i`` of every decoder map belongs to the query that predicted ``outputs[i]``.

    Args:
      model: a built ``aiayn.models.transformer.Transformer``.
      tokenizer: its ``SubwordTokenizer`` (special ids are read from it).
      sources: ``B`` source sentences, featurised with ``tokenizer.featurize_source`` (the
        one source featuriser; an empty source is a lone EOS, as in serving).
      outputs: ``B`` lists of produced token ids (no BOS; EOS last where it was produced).
      max_length: the source limit (``aiayn.pipeline.config.source_limit(cfg)``).

    Returns:
      dict with numpy arrays: ``encoder_self`` / ``decoder_self`` / ``cross``: lists over layers
      of float32 ``(B, heads, S, S)`` / ``(B, heads, T, T)`` / ``(B, heads, T, S)``;
      ``encoder_token_ids`` int32 ``(B, S)``, ``encoder_padding_mask`` bool ``(B, S)``,
      ``decoder_token_ids`` int32 ``(B, T)``, ``decoder_padding_mask`` bool ``(B, T)``,
      ``output_token_ids`` int32 ``(B, T)`` (pad_id on padding).

    Raises:
      ValueError: ``sources`` and ``outputs`` differ in length, or an output is empty.
    """
    import tensorflow as tf

    if len(sources) != len(outputs):
        raise ValueError(f"`sources` and `outputs` must pair up. Received {len(sources)} "
                         f"sources and {len(outputs)} outputs.")
    if not sources:
        raise ValueError("`attention_maps` needs at least one sentence.")
    rows = [[int(t) for t in out] for out in outputs]
    if any(not r for r in rows):
        raise ValueError("Every output needs at least one token (EOS counts).")
    features = tokenizer.featurize_source(tf.constant(list(sources), tf.string), max_length)
    enc_ids, enc_mask = features.token_ids.numpy(), features.padding_mask.numpy()
    width = max(len(r) for r in rows)
    dec_ids = np.full((len(rows), width), tokenizer.pad_id, np.int32)  # (B, T)
    out_ids = np.full((len(rows), width), tokenizer.pad_id, np.int32)  # (B, T)
    dec_mask = np.zeros((len(rows), width), bool)
    for b, r in enumerate(rows):
        dec_ids[b, :len(r)] = [tokenizer.bos_id] + r[:-1]  # shift right: what the decoder saw
        out_ids[b, :len(r)] = r
        dec_mask[b, :len(r)] = True
    weights = model.attention_weights({
        "encoder_token_ids": enc_ids, "encoder_padding_mask": enc_mask,
        "decoder_token_ids": dec_ids, "decoder_padding_mask": dec_mask})
    result: dict[str, Any] = {k: [np.asarray(w, dtype=np.float32) for w in weights[k]]
                              for k in KINDS}
    result.update(encoder_token_ids=enc_ids, encoder_padding_mask=enc_mask,
                  decoder_token_ids=dec_ids, decoder_padding_mask=dec_mask,
                  output_token_ids=out_ids)
    return result


def _pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    import tensorflow as tf

    if len(ids) == 0:
        return []
    raw = tokenizer.id_to_piece(tf.constant(list(ids), tf.int32)).numpy()
    return [p.decode("utf-8", errors="replace") for p in raw]


def _resolve_layer(layer: int, num_layers: int, stack: str) -> int:
    if not -num_layers <= layer < num_layers:
        noun = "layer" if num_layers == 1 else "layers"
        raise UserInputError(f"Layer {layer} does not exist: the model's {stack} has "
                             f"{num_layers} {noun} (use 0..{num_layers - 1}, or -1 for the "
                             "last).")
    return layer % num_layers


def explain_translation(model: Any, tokenizer: Any, sentence: str, out_png: str | Path,
                        layer: int = -1, beam_size: int = 4, length_penalty: float = 0.6,
                        max_extra_length: int = 50, max_length: int = 256,
                        stop_rule: str = "current",
                        self_attention: bool = False, dpi: int = 100) -> dict[str, Any]:
    """Translates one sentence and plots the cross-attention of one decoder layer per head.

    The figure holds one heatmap per head and the average over heads (source subwords on x,
    produced subwords on y; one colour scale from 0 to the largest weight). With
    ``self_attention`` two more files are written beside it: ``<stem>.encoder_self.png``
    (source x source) and ``<stem>.decoder_self.png`` (produced tokens x decoder inputs,
    causal).

    Args:
      model: a built Transformer with trained weights.
      tokenizer: its ``SubwordTokenizer``.
      sentence: the source text.
      out_png: where the cross-attention figure goes.
      layer: which layer (of the decoder for cross/decoder maps, of the encoder for encoder
        maps); negative counts from the end of each stack (default: the last of each).
      beam_size, length_penalty, max_extra_length, stop_rule: decode settings for
        ``model.generate`` (``beam_size=1`` is greedy).
      max_length: the source limit (``aiayn.pipeline.config.source_limit(cfg)``).
      self_attention: also plot the encoder and decoder self-attention of ``layer``.
      dpi: image resolution; the size in pixels is ``image_size``.

    Returns:
      dict: ``source``, ``translation``, ``score``, ``layer`` (resolved decoder index),
      ``encoder_layer`` (resolved encoder index; the same as ``layer`` unless the two stacks
      differ in depth and ``layer`` is negative),
      ``unknown_fraction`` (of the source's characters, as the ``n_best`` signature says),
      ``source_ids`` / ``source_pieces`` (S), ``output_ids`` / ``output_pieces`` (T, the
      produced tokens, EOS (``</s>``) last when the search produced it),
      ``decoder_input_pieces`` (T), ``cross`` float32 ``(heads, T, S)``, ``cross_mean``
      ``(T, S)``, ``encoder_self`` ``(heads, S, S)``, ``decoder_self`` ``(heads, T, T)``,
      ``paths`` (kind -> Path of each written file), ``image_size``
      ((width, height) pixels of ``out_png``).

    Raises:
      UserInputError: the sentence has no subwords, or ``layer`` does not exist.

    Example:
      >>> data = explain_translation(model, tok, "I love you.", "attention.png", beam_size=4)
      >>> data["output_pieces"], data["cross_mean"].shape
      (['▁Te', '▁amo', '.', '</s>'], (4, 4))
    """
    import tensorflow as tf

    features = tokenizer.featurize_source(tf.constant([sentence], tf.string), max_length)
    if bool(features.empty.numpy()[0]):
        raise UserInputError(f"Nothing to explain: {sentence!r} has no subwords.")
    ids, mask = features.token_ids, features.padding_mask
    encoder_depth, decoder_depth = int(model.num_layers), int(model.num_decoder_layers)
    layer, encoder_layer = (_resolve_layer(layer, decoder_depth, "decoder"),
                            _resolve_layer(layer, encoder_depth, "encoder"))

    produced, translation, score = _search(model, tokenizer, ids, mask, beam_size,
                                           length_penalty, max_extra_length, stop_rule)
    maps = attention_maps(model, tokenizer, [sentence], [produced], max_length=max_length)
    source_ids = maps["encoder_token_ids"][0]
    source_pieces = _pieces(tokenizer, source_ids)
    output_pieces = _pieces(tokenizer, produced)
    input_pieces = _pieces(tokenizer, maps["decoder_token_ids"][0])
    cross = maps["cross"][layer][0]  # (heads, T, S)
    data: dict[str, Any] = {
        "source": sentence, "translation": translation, "score": score, "layer": layer,
        "encoder_layer": encoder_layer,
        "unknown_fraction": float(features.unknown_fraction.numpy()[0]),
        "source_ids": [int(t) for t in source_ids], "output_ids": produced,
        "source_pieces": source_pieces, "output_pieces": output_pieces,
        "decoder_input_pieces": input_pieces,
        "cross": cross, "cross_mean": cross.mean(axis=0),
        "encoder_self": maps["encoder_self"][encoder_layer][0],
        "decoder_self": maps["decoder_self"][layer][0],
        "paths": {},
    }
    _plot_explanation(data, Path(out_png), (encoder_depth, decoder_depth), self_attention, dpi)
    return data


def _search(model: Any, tokenizer: Any, ids, mask, beam_size: int, length_penalty: float,
            max_extra_length: int, stop_rule: str = "current") -> tuple[list[int], str, float]:
    """``model.generate`` on one featurised sentence: produced ids (EOS last when the search
    stopped on it), the translation and its score."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32),
                                  tf.TensorSpec([None, None], tf.bool)])
    def generate(token_ids, padding_mask):
        return model.generate(token_ids, padding_mask, bos_id=tokenizer.bos_id,
                              eos_id=tokenizer.eos_id, beam_size=beam_size,
                              length_penalty=length_penalty, max_extra_length=max_extra_length,
                              n_best=1, stop_rule=stop_rule)

    out = generate(tf.cast(ids, tf.int32), mask)
    generated = out["token_ids"].numpy()[0, 0]  # (L,) no BOS; EOS and after = pad
    length = int(out["lengths"].numpy()[0, 0])
    produced = [int(t) for t in generated[:length]]
    if length < generated.shape[0]:  # search stopped on EOS (else it ran out of length)
        produced.append(tokenizer.eos_id)
    translation = tokenizer.detokenize(tf.constant([produced], tf.int32)).numpy()[0]
    return produced, translation.decode("utf-8"), float(out["scores"].numpy()[0, 0])


def _plot_explanation(data: dict[str, Any], out_png: Path, depths: tuple[int, int],
                      self_attention: bool, dpi: int) -> None:
    """Writes the cross-attention figure (and the self-attention ones); fills ``data``."""
    layer, sentence = data["layer"], data["source"]
    (n_encoder, n_layers), encoder_layer = depths, data["encoder_layer"]
    source_pieces, output_pieces = data["source_pieces"], data["output_pieces"]
    input_pieces, cross = data["decoder_input_pieces"], data["cross"]
    data["image_size"] = plot_heads(
        cross, source_pieces, output_pieces, out_png, dpi=dpi,
        title=f"Cross-attention, decoder layer {layer + 1}/{n_layers}: "
              f"{_shorten(sentence)} \u2192 {_shorten(data['translation'])}",
        xlabel="source subwords", ylabel="produced subwords")
    data["paths"]["cross"] = out_png
    if self_attention:
        for kind, x_labels, y_labels, title, xlabel, ylabel in (
                ("encoder_self", source_pieces, source_pieces,
                 f"Encoder self-attention, layer {encoder_layer + 1}/{n_encoder}",
                 "source subwords",
                 "source subwords (queries)"),
                ("decoder_self", input_pieces, output_pieces,
                 f"Decoder self-attention (causal), layer {layer + 1}/{n_layers}",
                 "decoder inputs", "produced subwords (queries)")):
            path = out_png.with_name(f"{out_png.stem}.{kind}{out_png.suffix or '.png'}")
            plot_heads(data[kind], x_labels, y_labels, path, title=title, xlabel=xlabel,
                        ylabel=ylabel, dpi=dpi)
            data["paths"][kind] = path




def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"
