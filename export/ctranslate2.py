"""CTranslate2 as a second export target: the trained Transformer for CTranslate2's Translator.

The SavedModel (:mod:`aiayn.export.saved_model`) is what TF Serving runs; this module writes the
same trained weights as a CTranslate2 model directory and translates with it, with the
SavedModel's text semantics: the run's SentencePiece model, the one source limit
(:func:`aiayn.models.limits.source_limit`), the same output budget and the same banned tokens.

    path = export_ctranslate2(model, tokenizer, "exports", "translate", options,
                              quantization="int8")
    CTranslate2Translator(path, intra_threads=2).translate(["I love you."])[0].text

On disk, beside the SavedModel versions (``<base_dir>/<model_name>/<version>/``)::

    <base_dir>/ctranslate2/<model_name>[-<quantization>]/<version>/
        model.bin, config.json, shared_vocabulary.json   CTranslate2's own files (source_ and
                                                        target_vocabulary.json for a model
                                                        with output ids)
        spm.model                                       the SentencePiece model
        aiayn_ct2.json                                  limits, search settings, special ids,
                                                        protect_pattern
        config.yaml                                     the resolved run configuration, if given

The ``ctranslate2`` folder holds no integer-named directory itself, so neither
``models.config`` nor the development server ever mistakes it for a SavedModel servable.

Weight mapping (Keras ``Transformer`` -> ``ctranslate2.specs.TransformerSpec``):

* one shared table ``E`` (V, d): encoder embeddings, decoder embeddings and, when tied (§3.4),
  the output projection (no bias); CTranslate2 stores it once (aliases). Embeddings are scaled
  by ``sqrt(d)`` (``scale_embeddings``, §3.4);
* positions: our table is *interleaved* (sin on even, cos on odd dimensions,
  :func:`aiayn.models.embedding.sinusoidal_table`); CTranslate2's built-in sinusoid puts all
  sines first, then all cosines, so the table itself is stored (``position_encodings``,
  ``max_position`` rows, encoder and decoder);
* Keras ``Dense`` kernels are ``(in, out)``, CTranslate2 linear weights ``(out, in)``: every
  kernel is transposed; biases copied. The fused self-attention ``qkv`` (3d) and the fused
  cross-attention ``key_value`` (2d) keep their order [q | k | v] / [k | v], which is
  CTranslate2's fused layout, and both split heads as ``(H, D)`` in that order;
* post-norm (``pre_norm=False``: ``LayerNorm(x + Sublayer(x))``, no final norm), or pre-norm
  with the stacks' final norms when the model was trained with ``norm_first``; LayerNorm
  epsilon from the model;
* the feed-forward activation of ``model.ffn_activation``; a gated one (``swiglu``, ``geglu``)
  has one ``(d, 2 d_ff)`` Keras kernel, [gate | linear], split into CTranslate2's ``linear_0``
  (activated) and ``linear_0_noact`` (``ffn_glu``).

What CTranslate2 cannot match exactly (README, "CTranslate2"): its length penalty is
``logprob / length ** alpha`` where ours is GNMT's ``logprob / ((5 + length) / 6) ** alpha``
(both count EOS here), and its beam search stops once ``beam_size`` hypotheses have finished,
where ours stops when no alive beam can still beat the n-best finished ones. Greedy search is
token-identical (tests/export/test_ctranslate2.py).

``ctranslate2`` is an optional dependency (``pip install '.[ct2]'``) imported only when used;
this module imports no TensorFlow or Keras at load time, so translating needs neither.
"""

from __future__ import annotations

import dataclasses
import json
import os
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from aiayn.export.fileio import list_versions
from aiayn.models.limits import source_limit
from aiayn.models.protect import (
    DEFAULT_PATTERN,
    TextSegments,
    check_pattern,
    join_text,
    split_protected_text,
)

CT2_DIR = "ctranslate2"
SETTINGS_FILE = "aiayn_ct2.json"
SPM_FILE = "spm.model"
FORMAT = "aiayn-ctranslate2/1"
# "none" keeps the weights as they are (float32); the rest are CTranslate2's own names.
QUANTIZATIONS = ("none", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16", "float32")
# Stored weights equal the Keras float32 weights: the export checks greedy token identity.
_LOSSLESS = ("none", "float32")
INSTALL_HINT = "pip install '.[ct2]' (or pip install 'ctranslate2>=4.5,<5')"


class CTranslate2Error(ValueError):
    """A CTranslate2 export or translation cannot be done as asked (the message says why and
    what to do); the command line reports it as one line."""


def import_ctranslate2():
    """The ``ctranslate2`` module, or :class:`CTranslate2Error` naming how to install it."""
    try:
        import ctranslate2
    except ImportError as err:
        raise CTranslate2Error(
            f"CTranslate2 is not installed ({err}). Install the optional extra: {INSTALL_HINT}."
        ) from None
    return ctranslate2


def model_dir_name(model_name: str, quantization: str = "none") -> str:
    """``<model_name>`` for unquantized weights, else ``<model_name>-<quantization>``."""
    return model_name if quantization in ("none", "", None) else f"{model_name}-{quantization}"


def ct2_model_dir(base_dir: str | os.PathLike, model_name: str,
                  quantization: str = "none") -> Path:
    """``<base_dir>/ctranslate2/<model_name>[-<quantization>]``: the versions of one export."""
    return Path(base_dir) / CT2_DIR / model_dir_name(model_name, quantization)


def resolve_ct2_export(path: str | os.PathLike, create_hint: str) -> Path:
    """A CTranslate2 version directory: ``path`` itself when it holds a model, else its highest
    integer version.

    Raises:
      CTranslate2Error: nothing there; the message names the path and ``create_hint`` (the
        command that creates it).
    """
    path = Path(path)
    if (path / "model.bin").is_file():
        return path
    versions = list_versions(path)
    if not versions:
        raise CTranslate2Error(f"No CTranslate2 export under {path} (expected model.bin or "
                               f"integer version directories such as 1/). Create it with "
                               f"`{create_hint}`.")
    return path / str(versions[-1])


# -- conversion ------------------------------------------------------------------------------
def _array(variable) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(variable), dtype=np.float32)


def _set_linear(spec, dense, outputs=None) -> None:
    """Keras ``Dense`` (kernel ``(in, out)``) -> CTranslate2 linear (weight ``(out, in)``);
    ``outputs``: only these output units, in this order (None: all)."""
    weight, bias = _array(dense.kernel).T, _array(dense.bias) if dense.use_bias else None
    if outputs is not None:
        weight, bias = weight[outputs], None if bias is None else bias[outputs]
    spec.weight = np.ascontiguousarray(weight)
    if bias is not None:
        spec.bias = bias


def _set_norm(spec, norm) -> None:
    spec.gamma = _array(norm.gamma)
    spec.beta = _array(norm.beta)


def _set_ffn(spec, layer) -> None:
    ffn = layer.feed_forward
    _set_linear(spec.linear_0, ffn.intermediate_dense)
    if ffn.gate_activation is not None:
        # One (d, 2 d_ff) dense layer in Keras, [gate | linear]; CTranslate2 activates
        # linear_0 and multiplies it by linear_0_noact.
        weight, bias = spec.linear_0.weight, spec.linear_0.bias
        spec.linear_0.weight, spec.linear_0_noact.weight = np.split(weight, 2, axis=0)
        spec.linear_0.bias, spec.linear_0_noact.bias = np.split(bias, 2)
    _set_linear(spec.linear_1, ffn.output_dense)
    _set_norm(spec.layer_norm, layer.feed_forward_norm)


def _activation(specs, name: str):
    """CTranslate2's activation for ``model.ffn_activation`` (the gate's, when gated)."""
    return {"relu": specs.Activation.RELU, "gelu": specs.Activation.GELU,
            "swiglu": specs.Activation.SWISH, "geglu": specs.Activation.GELU}[name]


def _set_self_attention(spec, layer) -> None:
    attention = layer.self_attention
    _set_linear(spec.linear[0], attention.qkv_dense)  # (3d, d): [q | k | v]
    _set_linear(spec.linear[1], attention.output_dense)
    _set_norm(spec.layer_norm, layer.self_attention_norm)


def _set_cross_attention(spec, layer) -> None:
    attention = layer.cross_attention
    _set_linear(spec.linear[0], attention.query_dense)
    _set_linear(spec.linear[1], attention.key_value_dense)  # (2d, d): [k | v]
    _set_linear(spec.linear[2], attention.output_dense)
    _set_norm(spec.layer_norm, layer.cross_attention_norm)


def transformer_spec(model: Any, pieces: Sequence[str], special: dict[str, str]):
    """The ``ctranslate2.specs.TransformerSpec`` of a built Keras ``Transformer``.

    Args:
      model: an ``aiayn.models.transformer.Transformer`` with its weights.
      pieces: the SentencePiece pieces by id (the shared source and target vocabulary; the
        target vocabulary is ``model.output_ids``' pieces where the model has them).
      special: ``unk``, ``bos``, ``eos`` pieces.

    Returns:
      A spec ready for ``validate()`` / ``optimize()`` / ``save()``.
    """
    import keras

    from aiayn.models.embedding import sinusoidal_table
    from aiayn.models.feedforward import GATED_ACTIVATIONS

    ct2 = import_ctranslate2()
    specs = ct2.specs
    spec = specs.TransformerSpec.from_config(
        (model.num_layers, model.num_decoder_layers), model.num_heads,
        pre_norm=bool(model.norm_first), activation=_activation(specs, model.ffn_activation),
        ffn_glu=model.ffn_activation in GATED_ACTIVATIONS)
    table = _array(model.embedding.embeddings)  # (V, d), shared (§3.4)
    # Interleaved sin/cos, the model's own function: max_position rows cover every encoder
    # position (< source limit) and every decoder input position (< max_position).
    positions = np.asarray(keras.ops.convert_to_numpy(
        sinusoidal_table(model.max_position, model.hidden_dim)), dtype=np.float32)
    for stack_spec, stack in ((spec.encoder, model.encoder), (spec.decoder, model.decoder)):
        stack_spec.scale_embeddings = True  # sqrt(d_model)
        stack_spec.position_encodings.encodings = positions
        if model.norm_first:
            _set_norm(stack_spec.layer_norm, stack.final_norm)
    # A model restricted to output ids (data.output_vocabulary=target) has a target vocabulary
    # of those pieces: its rows of the table, its columns of an untied projection.
    output = None if model.output_ids is None else list(model.output_ids)
    target_table = table if output is None else np.ascontiguousarray(table[output])
    spec.encoder.embeddings[0].weight = table
    spec.decoder.embeddings.weight = target_table
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.encoder_layers):
        _set_self_attention(layer_spec.self_attention, layer)
        _set_ffn(layer_spec.ffn, layer)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.decoder_layers):
        _set_self_attention(layer_spec.self_attention, layer)
        _set_cross_attention(layer_spec.attention, layer)
        _set_ffn(layer_spec.ffn, layer)
    if model.output_projection is None:
        spec.decoder.projection.weight = target_table  # tied: logits = x E^T, no bias
    else:
        _set_linear(spec.decoder.projection, model.output_projection, output)
    spec.config.layer_norm_epsilon = float(model.layer_norm_epsilon)
    spec.config.unk_token = special["unk"]
    spec.config.bos_token = special["bos"]
    spec.config.eos_token = special["eos"]
    spec.config.decoder_start_token = special["bos"]  # position 0 of the decoder is BOS
    spec.config.add_source_bos = False  # the source side carries no BOS / EOS
    spec.config.add_source_eos = False
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces) if output is None
                                    else [pieces[i] for i in output])
    return spec


def _processor(model_proto: bytes):
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(bytes(model_proto))
    return processor


def _settings(model: Any, tokenizer: Any, options: Any, quantization: str) -> dict[str, Any]:
    limit = source_limit(options.max_input_tokens, model.max_position, options.max_extra_length)
    ct2 = import_ctranslate2()
    return {
        "format": FORMAT, "quantization": quantization,
        "ctranslate2_version": ct2.__version__,
        "input_limit": limit, "on_long_input": options.on_long_input,
        "max_extra_length": int(options.max_extra_length),
        "max_position": int(model.max_position),
        "beam_size": int(options.beam_size), "n_best": int(options.n_best),
        "length_penalty": float(options.length_penalty),
        "max_batch_size": int(options.max_batch_size),
        "protect_pattern": str(getattr(options, "protect_pattern", DEFAULT_PATTERN)),
        "pad_id": int(tokenizer.pad_id), "unk_id": int(tokenizer.unk_id),
        "bos_id": int(tokenizer.bos_id), "eos_id": int(tokenizer.eos_id),
        "length_penalty_formula": "ctranslate2: logprob / length ** alpha (length counts EOS); "
                                  "the SavedModel: logprob / ((5 + length) / 6) ** alpha",
    }


def convert(model: Any, tokenizer: Any, options: Any, output_dir: str | os.PathLike,
            quantization: str = "none", config_yaml: str | None = None) -> Path:
    """Writes the CTranslate2 model directory (``output_dir`` must not exist yet).

    Args:
      model: the built Keras Transformer with its trained weights.
      tokenizer: its ``SubwordTokenizer`` (the SentencePiece model travels with the export).
      options: the export's ``ServingOptions`` (or anything with its fields).
      output_dir: the directory to create.
      quantization: one of :data:`QUANTIZATIONS` (``"none"``: float32 as trained).
      config_yaml: the resolved run configuration, stored as ``config.yaml``.

    Raises:
      CTranslate2Error: an unknown quantization, or CTranslate2 missing.
    """
    if quantization not in QUANTIZATIONS:
        raise CTranslate2Error(f"Unknown quantization {quantization!r}; choose one of "
                               f"{', '.join(QUANTIZATIONS)}.")
    ct2 = import_ctranslate2()
    processor = _processor(tokenizer.model_proto)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    special = {name: pieces[getattr(tokenizer, f"{name}_id")] for name in ("unk", "bos", "eos")}

    class KerasTransformerConverter(ct2.converters.Converter):
        """CTranslate2's converter protocol over our in-memory Keras model."""

        def _load(self):
            return transformer_spec(model, pieces, special)

    output_dir = Path(output_dir)
    KerasTransformerConverter().convert(
        str(output_dir), quantization=None if quantization == "none" else quantization)
    (output_dir / SPM_FILE).write_bytes(bytes(tokenizer.model_proto))
    settings = _settings(model, tokenizer, options, quantization)
    (output_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n",
                                            encoding="utf-8")
    if config_yaml is not None:
        (output_dir / "config.yaml").write_text(config_yaml, encoding="utf-8")
    return output_dir


def keras_greedy(model: Any, tokenizer: Any, texts: Sequence[str], limit: int,
                 max_extra_length: int) -> tuple[list[list[int]], list[float]]:
    """The Keras model's own greedy search (``model.generate``, beam 1) through the one
    featuriser: the reference CTranslate2's greedy output must equal.

    Returns:
      ``(ids, log_probs)``: per text the generated ids (no BOS/EOS; ``[]`` for an input with
      no pieces) and their summed log-probability (EOS included; length penalty 0).
    """
    import tensorflow as tf

    features = tokenizer.featurize_source(tf.constant(list(texts), tf.string), limit)
    out = model.generate(features.token_ids, features.padding_mask, bos_id=tokenizer.bos_id,
                         eos_id=tokenizer.eos_id, beam_size=1, length_penalty=0.0,
                         max_extra_length=max_extra_length, n_best=1)
    token_ids = np.asarray(out["token_ids"])[:, 0]  # (B, L), EOS and after = pad
    lengths = np.asarray(out["lengths"])[:, 0]
    empty = np.asarray(features.empty)
    ids = [[] if e else row[:n].tolist() for row, n, e in zip(token_ids, lengths, empty)]
    return ids, np.asarray(out["scores"])[:, 0].tolist()


def verify_ct2_export(model_dir: str | os.PathLike, model: Any, tokenizer: Any,
                      texts: Sequence[str]) -> dict[str, Any]:
    """Loads the written directory in CTranslate2 and translates ``texts`` greedily; for
    lossless weights the tokens must equal the Keras model's greedy search.

    Raises:
      CTranslate2Error: the model does not load or translate, or (lossless) a sentence
        differs from the Keras model's greedy output (names it).
    """
    try:
        translator = CTranslate2Translator(model_dir, intra_threads=1)
        got = translator.greedy_ids(texts)
    except (RuntimeError, ValueError) as err:
        raise CTranslate2Error(f"The CTranslate2 model in {model_dir} does not translate: "
                               f"{err}") from err
    settings = translator.settings
    report = {"sentences": len(texts), "compared_with_keras": False}
    if settings["quantization"] in _LOSSLESS:
        want, _ = keras_greedy(model, tokenizer, texts, settings["input_limit"],
                               settings["max_extra_length"])
        for text, a, b in zip(texts, got, want):
            if a != b:
                raise CTranslate2Error(
                    f"CTranslate2's greedy output differs from the Keras model's for {text!r}: "
                    f"{a} != {b}. The conversion does not reproduce the model; nothing was "
                    "published.")
        report["compared_with_keras"] = True
    return report


def export_ctranslate2(model: Any, tokenizer: Any, base_dir: str | os.PathLike,
                       model_name: str, options: Any, *, quantization: str = "none",
                       version: int = 0, config_yaml: str | None = None,
                       sample_texts: Sequence[str] = (), lock_wait_s: float = 600.0) -> Path:
    """Writes ``<base_dir>/ctranslate2/<model_name>[-<quantization>]/<version>/`` atomically.

    Under the export base's lock (``<base_dir>/.export.lock``, the SavedModel exports' lock),
    the version is numbered, converted into a temporary sibling ``.tmp-<version>-<id>``,
    verified (:func:`verify_ct2_export` on ``sample_texts``), fsynced and renamed into place:
    a reader never sees half a version, and a failed or killed export publishes nothing.

    Args:
      model, tokenizer, options, quantization, config_yaml: as :func:`convert`.
      base_dir: the export base (``export.base_dir``).
      model_name: ``export.model_name``.
      version: 0 = the next after the highest; else that version (must not exist).
      sample_texts: sentences the verification translates.
      lock_wait_s: how long to wait for another export of the same base.

    Returns:
      The published version directory.

    Raises:
      CTranslate2Error: a bad quantization, CTranslate2 missing, or the verification failed.
      aiayn.export.saved_model.ExportError: the version exists, or the lock stays held.
    """
    # The SavedModel export's versioning (lock, leftovers, numbering, fsync, atomic rename).
    from aiayn.export.saved_model import _new_version

    if quantization not in QUANTIZATIONS:
        raise CTranslate2Error(f"Unknown quantization {quantization!r}; choose one of "
                               f"{', '.join(QUANTIZATIONS)}.")
    import_ctranslate2()
    name = f"{CT2_DIR}/{model_dir_name(model_name, quantization)}"
    with _new_version(base_dir, name, int(version), lock_wait_s) as (number, tmp):
        convert(model, tokenizer, options, tmp, quantization, config_yaml)
        verify_ct2_export(tmp, model, tokenizer, list(sample_texts))
    return ct2_model_dir(base_dir, model_name, quantization) / str(number)


# -- translation -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Translation:
    """One translated sentence (the fields of ``aiayn.export.client.Translation``)."""

    text: str
    score: float
    n_best: tuple[tuple[str, float], ...] = ()
    truncated: bool = False
    unknown_fraction: float | None = None


class Features(NamedTuple):
    """What :meth:`CTranslate2Translator.featurize` returns, one entry per text: the kept
    pieces (``[]``: no pieces at all), whether the input was truncated or had no pieces, and
    the share of its visible characters inside ``<unk>`` pieces (0 when it has none)."""

    tokens: list[list[str]]
    truncated: list[bool]
    empty: list[bool]
    unknown_fraction: list[float]


def _encode_with_offsets(processor, texts: list[str]):
    """SentencePiece protos (``.pieces``: ``id``, byte offsets ``begin``, ``end``) per text."""
    try:
        return processor.encode(texts, return_type="proto")
    except TypeError:  # an older sentencepiece: no return_type yet
        return processor.encode(texts, out_type="immutable_proto")


def _visible_chars(text: str) -> int:
    """Characters of ``text``, whitespace and Unicode separators (Z*) not counted."""
    return sum(1 for c in text
               if not (c in "\t\n\f\r " or unicodedata.category(c).startswith("Z")))


def _unknown_share(pieces: Sequence[str], fractions: Sequence[float]) -> float:
    """The share of unknown characters over several pieces, from each piece's share."""
    visible = [_visible_chars(p) for p in pieces]
    total = sum(visible)
    unknown = sum(round(f * v) for f, v in zip(fractions, visible))
    return min(unknown / total, 1.0) if total else 0.0


class CTranslate2Translator:
    """Translates with an exported CTranslate2 model, with the SavedModel's text semantics.

    Protected spans (placeholders, options, numbers, URLs, markup) pass through unchanged,
    cut and joined by :mod:`aiayn.models.protect`'s Python twin of the graph's split, with the
    export's ``protect_pattern`` (``aiayn_ct2.json``; the default for exports without it).
    Source side as ``SubwordTokenizer.featurize_source``: SentencePiece (the model's own
    normaliser), no BOS/EOS, the first ``input_limit`` pieces kept (or, exported with
    ``on_long_input=reject``, an over-long input refused); an input with no pieces translates
    to ``""`` with score 0. Output budget as ``Transformer.generate``: at most
    ``min(longest kept source in the batch + max_extra_length, max_position)`` tokens, EOS
    included; BOS and PAD are never generated. Beam search uses CTranslate2's length penalty
    (module docstring).

    Args:
      model_dir: a version directory written by :func:`export_ctranslate2`.
      device: ``"cpu"`` or ``"cuda"``.
      compute_type: CTranslate2's compute type (``"default"``: as stored).
      intra_threads: threads per translation (0: CTranslate2's default).
      inter_threads: translations run in parallel.

    Raises:
      CTranslate2Error: CTranslate2 missing, or ``model_dir`` is not such a directory.
    """

    def __init__(self, model_dir: str | os.PathLike, device: str = "cpu",
                 compute_type: str = "default", intra_threads: int = 0, inter_threads: int = 1):
        model_dir = Path(model_dir)
        settings_path = model_dir / SETTINGS_FILE
        if not settings_path.is_file() or not (model_dir / "model.bin").is_file():
            raise CTranslate2Error(f"{model_dir} is not a CTranslate2 export of this project "
                                   f"(no model.bin or {SETTINGS_FILE}). Create one with "
                                   "`aiayn export --format ctranslate2`.")
        ct2 = import_ctranslate2()
        self.model_dir = model_dir
        self.settings = json.loads(settings_path.read_text(encoding="utf-8"))
        self.processor = _processor((model_dir / SPM_FILE).read_bytes())
        size = self.processor.get_piece_size()
        self.pieces = [self.processor.id_to_piece(i) for i in range(size)]
        self.piece_ids = {piece: i for i, piece in enumerate(self.pieces)}
        s = self.settings
        self.eos_piece = self.pieces[s["eos_id"]]
        banned = [s["bos_id"]] + ([s["pad_id"]] if s["pad_id"] != s["eos_id"] else [])
        self._suppress = [[self.pieces[i]] for i in banned]
        self.translator = ct2.Translator(str(model_dir), device=device, compute_type=compute_type,
                                         intra_threads=intra_threads,
                                         inter_threads=inter_threads)

    # -- featurisation ---------------------------------------------------------------------
    def featurize(self, texts: Sequence[str]) -> Features:
        """The featuriser's semantics in Python (``SubwordTokenizer.featurize_source``)."""
        limit = self.settings["input_limit"]
        texts = [str(t) for t in texts]
        encoded = _encode_with_offsets(self.processor, texts)
        ids = [[piece.id for piece in proto.pieces] for proto in encoded]
        truncated = [len(row) > limit for row in ids]
        if self.settings["on_long_input"] == "reject" and any(truncated):
            counts = [len(row) for row in ids]
            raise CTranslate2Error(
                f"Input text is too long: the model accepts at most {limit} subword tokens per "
                "sentence (export.max_input_tokens). Split the text into sentences, or "
                f"re-export with export.on_long_input=truncate. Token counts per input: {counts}")
        unk = self.settings["unk_id"]
        unknown = []
        for text, proto in zip(texts, encoded):  # characters inside <unk> pieces
            data = text.encode("utf-8")
            spans = "".join(data[p.begin:p.end].decode("utf-8", "replace")
                            for p in proto.pieces if p.id == unk)
            total = _visible_chars(text)
            unknown.append(min(_visible_chars(spans) / total, 1.0) if total else 0.0)
        return Features(tokens=[[self.pieces[i] for i in row[:limit]] for row in ids],
                        truncated=truncated, empty=[not row for row in ids],
                        unknown_fraction=unknown)

    # -- search ----------------------------------------------------------------------------
    def _search(self, tokens: list[list[str]], beam_size: int, num_hypotheses: int,
                length_penalty: float):
        """CTranslate2 over the non-empty rows -> per row ``[(ids, score), ...]`` (None for
        empty rows)."""
        rows = [i for i, t in enumerate(tokens) if t]
        out: list[list[tuple[list[int], float]] | None] = [None] * len(tokens)
        if not rows:
            return out
        s = self.settings
        width = max(len(tokens[i]) for i in rows)  # the padded source width of the batch
        max_length = min(width + s["max_extra_length"], s["max_position"])
        results = self.translator.translate_batch(
            [tokens[i] for i in rows], max_batch_size=0, beam_size=beam_size,
            num_hypotheses=num_hypotheses, length_penalty=length_penalty,
            max_decoding_length=max_length, max_input_length=0, return_scores=True,
            return_end_token=True, suppress_sequences=self._suppress)
        for i, result in zip(rows, results):
            hyps = []
            for pieces, score in zip(result.hypotheses, result.scores):
                ids = [self.piece_ids[p] for p in pieces]
                ends = [k for k, t in enumerate(ids) if t in (s["eos_id"], s["pad_id"])]
                hyps.append((ids[:ends[0]] if ends else ids, float(score)))
            out[i] = hyps
        return out

    def greedy_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Greedy search as id lists (no BOS/EOS; ``[]`` for an empty input), one batch."""
        return self.greedy(texts)[0]

    def greedy(self, texts: Sequence[str]) -> tuple[list[list[int]], list[float]]:
        """Greedy search, one batch: ``(ids, log_probs)`` as :func:`keras_greedy` returns them
        (summed log-probabilities, EOS included, no length penalty; 0 for an empty input)."""
        found = self._search(self.featurize(texts).tokens, 1, 1, 0.0)
        return ([hyps[0][0] if hyps else [] for hyps in found],
                [hyps[0][1] if hyps else 0.0 for hyps in found])

    @property
    def protect_pattern(self) -> str:
        """The spans passed through untranslated (``aiayn.models.protect``): the export's
        ``protect_pattern``; exports written before it was stored use the default."""
        return self.settings.get("protect_pattern", DEFAULT_PATTERN)

    def segments(self, texts: Sequence[str]) -> list[TextSegments]:
        """Each text cut at its protected spans, as the SavedModel's graph cuts it."""
        pattern = check_pattern(self.protect_pattern, re2=False)
        return [split_protected_text(str(t), pattern) for t in texts]

    def translate(self, texts: Sequence[str], n_best: bool = False,
                  beam_size: int | None = None) -> list[Translation]:
        """Translates ``texts`` as one batch (the output budget depends on its longest input).

        As the SavedModel does: protected spans (placeholders, options, numbers, URLs, markup;
        ``aiayn.models.protect``) pass through unchanged and the pieces between them, of all
        texts, are translated as one batch; hypothesis k of a text joins hypothesis k of its
        pieces and scores the sum of theirs; ``truncated`` if a piece was; ``unknown_fraction``
        of the translated pieces' visible characters. A text without a span is translated
        whole, as before.

        Args:
          texts: source strings.
          n_best: also return the ``n_best`` hypotheses of the export's settings.
          beam_size: override the exported beam size (1 = greedy).

        Returns:
          One :class:`Translation` per text, in order.
        """
        s = self.settings
        beam = int(beam_size or s["beam_size"])
        count = min(s["n_best"], beam) if n_best else 1
        segments = self.segments(texts)
        source = [piece for seg in segments
                  for piece, translate in zip(seg.pieces, seg.translate) if translate]
        features = self.featurize(source)
        found = self._search(features.tokens, beam, count, s["length_penalty"])
        per_piece = []
        for hyps in found:
            if hyps is None:  # no pieces at all: "" with score 0, as the SavedModel answers
                per_piece.append((("", 0.0),) * count)
            else:
                pairs = [(self.processor.decode(ids), score) for ids, score in hyps]
                pairs += [pairs[-1]] * (count - len(pairs))  # CTranslate2 returns `count`
                per_piece.append(tuple(pairs[:count]))
        results, at = [], 0
        for seg in segments:
            n = sum(seg.translate)
            pieces = per_piece[at:at + n]
            if not seg.split:  # the whole text, as without protection
                pairs = pieces[0]
                cut, unknown = features.truncated[at], features.unknown_fraction[at]
            else:
                pairs = tuple((join_text(seg, [p[k][0] for p in pieces]),
                               float(sum(p[k][1] for p in pieces))) for k in range(count))
                cut = any(features.truncated[at:at + n])
                unknown = _unknown_share(source[at:at + n], features.unknown_fraction[at:at + n])
            at += n
            results.append(Translation(text=pairs[0][0], score=pairs[0][1],
                                       n_best=pairs if n_best else (), truncated=cut,
                                       unknown_fraction=unknown))
        return results

    def translate_sentences(self, sentences: Sequence[str], batch_size: int = 32,
                            sort_by_length: bool = True,
                            beam_size: int | None = None) -> list[str]:
        """Many sentences in batches of ``batch_size``; results in input order.

        ``sort_by_length`` batches sentences of similar length together (what
        ``aiayn.pipeline.training.validation.translate_sentences`` does for the SavedModel).
        """
        sentences = [str(s) for s in sentences]
        order = list(range(len(sentences)))
        if sort_by_length:
            lengths = [len(row) for row in self.processor.encode(sentences)]
            order = sorted(order, key=lambda i: lengths[i])
        out = [""] * len(sentences)
        for start in range(0, len(order), max(1, int(batch_size))):
            idx = order[start:start + batch_size]
            batch = self.translate([sentences[i] for i in idx], beam_size=beam_size)
            for i, result in zip(idx, batch):
                out[i] = result.text
        return out
