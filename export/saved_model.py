"""The serving SavedModel: strings in, translations out, with everything in between in-graph.

Signatures (the contract in docs/CONTRACTS.md and docs/ARCHITECTURE.md):

    serving_default   text: tf.string [None]  ->  translation: tf.string [None]
                                                  score:       tf.float32 [None]
    n_best            text: tf.string [None]  ->  translations: tf.string [None, n_best]
                                                  scores:       tf.float32 [None, n_best]
                                                  truncated:    tf.bool [None]
                                                  unknown_fraction: tf.float32 [None]

``unknown_fraction`` is the share of an input's characters the vocabulary does not know
(``SubwordTokenizer.featurize_source``), over the pieces translated (protected spans do not
count): near 1, the translation is a guess. ``truncated``: a piece was cut at the input limit.
For an input cut at protected spans, hypothesis k joins hypothesis k of its pieces and its score
is the sum of theirs.

Inside the graph: UTF-8 validation, the split at protected spans (placeholders, options,
numbers, URLs, e-mail addresses, markup: :mod:`aiayn.models.protect`, tensorflow-text's
``RegexSplitWithOffsets``), SentencePiece tokenisation (``tensorflow_text``, linked into the
stock ``tensorflow_model_server``), truncation or rejection of over-long pieces, the encoder,
cached beam search (``model.generate``), detokenisation and the join of the translated pieces
with the spans, which pass through unchanged (``ServingOptions.protect_pattern``; ``""`` = off).
An input without a span is translated whole, exactly as without protection. Outputs are dense
(TF Serving cannot return ragged tensors) and the input is a batch (``[None]``), so the server's
batcher can merge requests. Empty or whitespace-only strings translate to the empty string with
score 0.

On disk, the TF Serving layout::

    <base_dir>/models.config                 model_config_list for tensorflow_model_server
    <base_dir>/batching_parameters.txt       --batching_parameters_file
    <base_dir>/<model_name>/<version>/       saved_model.pb, variables/, assets/
        assets.extra/tf_serving_warmup_requests   PredictionLog TFRecord (one per length bucket)
        assets.extra/config.yaml                  the resolved run configuration
        assets.extra/spm.model                    the SentencePiece model
        assets.extra/eval_scores.json             evaluation scores, when given
        assets.extra/verify_samples.json          in-process outputs the verifier compares with

A version is written into a temporary sibling directory (``.tmp-...``; TF Serving only looks at
integer names) and renamed into place, so a watching server never sees a partial version and an
interrupted export leaves no version directory.

Example::

    export_dir = export_saved_model(model, tokenizer, "exports", "translate",
                                    options=ServingOptions(beam_size=4, n_best=4))
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from aiayn.export.codec import to_python
from aiayn.export.fileio import (
    LockHeld,
    atomic_write,
    fault_point,
    fsync_dir,
    hold_lock,
    list_versions,
    remove_leftovers,
)
from aiayn.export.warmup import (
    INPUT_KEY,
    NBEST_SIGNATURE,
    SERVING_SIGNATURE,
    warmup_texts,
    write_warmup_requests,
)
from aiayn.models.decoding import STOP_RULES
from aiayn.models.limits import source_limit
from aiayn.models.protect import (
    DEFAULT_PATTERN,
    PatternError,
    check_pattern,
    join_translations,
    rows_unknown_fraction,
    scatter_to_rows,
    split_protected,
)

WARMUP_FILE = "tf_serving_warmup_requests"
SAMPLES_FILE = "verify_samples.json"
MODELS_CONFIG = "models.config"
BATCHING_FILE = "batching_parameters.txt"
_ON_LONG_INPUT = ("truncate", "reject")

# Sentences the verifier and tests translate: ordinary, empty, whitespace-only and non-ASCII.
DEFAULT_SAMPLE_TEXTS = (
    "In the beginning was the word.",
    "",
    "   ",
    "And the light shineth in darkness; and the darkness comprehended it not.",
    "Señor, ¿qué es la verdad?",
    "Use --verbose to print %d more lines.",  # protected spans (aiayn.models.protect)
)


class ExportError(ValueError):
    """The export cannot be written as asked (bad option, version already present, ...)."""


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """Search and input-limit settings baked into the exported graph.

    Attributes:
      beam_size: beams for both signatures (1 = greedy search).
      length_penalty: alpha of the GNMT length penalty (paper §6.1: 0.6).
      max_extra_length: generated tokens allowed beyond the input length (paper: +50).
      n_best: hypotheses returned by the ``n_best`` signature (<= beam_size).
      stop_rule: when a sentence's beam search stops, ``"current"`` or ``"bound"``
        (:mod:`aiayn.models.decoding`).
      max_input_tokens: subword tokens kept per input; longer inputs are truncated or rejected.
      on_long_input: ``"truncate"`` or ``"reject"`` (an in-graph assertion, INVALID_ARGUMENT).
      max_batch_size: the largest batch a server should accept (batching config, dev server).
      protect_pattern: spans passed through untranslated (placeholders, options, numbers,
        URLs, markup: :data:`aiayn.models.protect.DEFAULT_PATTERN`); ``""`` = off.
    """

    beam_size: int = 4
    length_penalty: float = 0.6
    max_extra_length: int = 50
    n_best: int = 4
    stop_rule: str = "current"
    max_input_tokens: int = 256
    on_long_input: str = "truncate"
    max_batch_size: int = 64
    protect_pattern: str = DEFAULT_PATTERN

    def __post_init__(self):
        try:
            check_pattern(self.protect_pattern)
        except PatternError as err:
            raise ExportError(f"`protect_pattern`: {err}") from None
        if self.stop_rule not in STOP_RULES:
            raise ExportError(f"`stop_rule` must be one of {', '.join(STOP_RULES)}; "
                              f"got {self.stop_rule!r}.")
        if self.on_long_input not in _ON_LONG_INPUT:
            raise ExportError(f"`on_long_input` must be one of {', '.join(_ON_LONG_INPUT)}; "
                              f"got {self.on_long_input!r}.")
        for name in ("beam_size", "n_best", "max_input_tokens", "max_batch_size"):
            if getattr(self, name) < 1:
                raise ExportError(f"`{name}` must be at least 1; got {getattr(self, name)}.")
        if self.n_best > self.beam_size:
            raise ExportError(f"`n_best` ({self.n_best}) cannot exceed `beam_size` "
                              f"({self.beam_size}).")

    @classmethod
    def from_configs(cls, decode: Any, export: Any) -> ServingOptions:
        """Builds options from the ``decode`` and ``export`` config sections (duck-typed)."""
        return cls(beam_size=decode.beam_size, length_penalty=decode.length_penalty,
                   max_extra_length=decode.max_extra_length, n_best=decode.n_best,
                   stop_rule=getattr(decode, "stop_rule", "current"),
                   max_input_tokens=export.max_input_tokens, on_long_input=export.on_long_input,
                   max_batch_size=export.max_batch_size,
                   protect_pattern=getattr(export, "protect_pattern", DEFAULT_PATTERN))


def _input_limit(model: Any, options: ServingOptions) -> int:
    """Tokens kept per input: :func:`aiayn.models.limits.source_limit`, the one limit."""
    try:
        return source_limit(options.max_input_tokens, getattr(model, "max_position", None) or
                            options.max_input_tokens + options.max_extra_length + 1,
                            options.max_extra_length)
    except ValueError as err:
        raise ExportError(str(err)) from None


class Translator(tf.Module):
    """Wraps a ``Transformer`` and a ``SubwordTokenizer`` as string-to-string graph functions.

    The same object is what the SavedModel stores and what in-process translation calls, so the
    exported graph and the Python path cannot drift.

    Args:
      model: a built ``aiayn.models.transformer.Transformer`` (anything with ``generate``).
      tokenizer: an ``aiayn.models.tokenizer.SubwordTokenizer``.
      options: :class:`ServingOptions`.
    """

    def __init__(self, model: Any, tokenizer: Any, options: ServingOptions):
        super().__init__(name="translator")
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.input_limit = _input_limit(model, options)
        self._make_functions()

    def _make_functions(self):
        """(Re)creates the graph functions; they trace on their first call, with the
        tokenizer's SentencePiece resource of this generation."""
        self._generation = self.tokenizer.resource_generation()
        spec = [tf.TensorSpec([None], tf.string, name=INPUT_KEY)]
        self.serve = tf.function(self._serve, input_signature=spec)
        self.serve_n_best = tf.function(self._serve_n_best, input_signature=spec)

    # -- featurisation -------------------------------------------------------------------------
    def _encode(self, text: tf.Tensor):
        """Text (batch,) -> the tokenizer's SourceFeatures, with the export's long-input rule."""
        features = self.tokenizer.featurize_source(text, self.input_limit)
        if self.options.on_long_input == "reject":
            limit = self.input_limit
            check_len = tf.debugging.assert_less_equal(
                features.lengths, tf.constant(limit, tf.int32),
                message=(f"Input text is too long: the model accepts at most {limit} subword "
                         "tokens per sentence (export.max_input_tokens). Split the text into "
                         "sentences, or re-export with export.on_long_input=truncate. "
                         "Token counts per input:"),
                summarize=64, name="check_input_length")
            with tf.control_dependencies([check_len]):
                features = features._replace(token_ids=tf.identity(features.token_ids))
        return features

    def _generate(self, text: tf.Tensor, n_best: int):
        """Text (batch,) -> translations and scores (batch, n_best), truncated and
        unknown_fraction (batch,), with the protected spans passed through.

        Each input is cut at its protected spans (:func:`aiayn.models.protect.split_protected`);
        the pieces to translate, of every input, go through :meth:`_generate_pieces` as one
        batch and are put back in place (:func:`aiayn.models.protect.join_translations`).
        Hypothesis k of an input is the join of hypothesis k of its pieces, its score the sum of
        their scores (a passed-through piece adds nothing; an input with nothing to translate
        scores 0). ``truncated``: any piece was; ``unknown_fraction``: of the translated pieces'
        visible characters (protected text does not count). An input without a span is one
        piece, the input itself: a batch without spans is translated exactly as with
        ``protect_pattern=""`` (same featuriser input, same ids, same scores).
        """
        pattern = self.options.protect_pattern
        if not pattern:
            return self._generate_pieces(text, n_best)
        segments = split_protected(text, pattern)
        translate = segments.translate.flat_values  # (pieces,)
        source = tf.boolean_mask(segments.pieces.flat_values, translate)  # (translated,)
        texts, scores, truncated, unknown = self._generate_pieces(source, n_best)
        # (translated, n_best) each; truncated, unknown: (translated,)
        out_texts = join_translations(segments, texts)  # (batch, n_best)
        out_scores = scatter_to_rows(segments, scores)  # (batch, n_best)
        out_truncated = scatter_to_rows(segments, truncated, reduce="any")  # (batch,)
        out_unknown = rows_unknown_fraction(segments, source, unknown)  # (batch,)
        return out_texts, out_scores, out_truncated, out_unknown

    def _generate_pieces(self, text: tf.Tensor, n_best: int):
        """Text (n,) -> texts, scores (n, n_best), truncated, unknown_fraction (n,): each text
        translated whole (the featuriser, ``model.generate``, detokenisation)."""
        features = self._encode(text)
        empty = features.empty
        out = self.model.generate(
            features.token_ids, features.padding_mask, bos_id=self.tokenizer.bos_id,
            eos_id=self.tokenizer.eos_id,
            beam_size=self.options.beam_size, length_penalty=self.options.length_penalty,
            max_extra_length=self.options.max_extra_length, n_best=n_best, dynamic_shapes=True,
            stop_rule=self.options.stop_rule)
        token_ids = tf.convert_to_tensor(out["token_ids"])  # (batch, n_best, out_len)
        scores = tf.cast(tf.convert_to_tensor(out["scores"]), tf.float32)  # (batch, n_best)
        batch = tf.shape(token_ids)[0]
        flat = tf.reshape(token_ids, [batch * n_best, -1])  # (batch * n_best, out_len)
        texts = tf.reshape(self.tokenizer.detokenize(flat), [batch, n_best])  # (batch, n_best)
        texts = tf.where(empty[:, None], tf.constant("", tf.string), texts)
        scores = tf.where(empty[:, None], tf.zeros_like(scores), scores)
        return texts, scores, features.truncated, features.unknown_fraction

    # -- signatures ----------------------------------------------------------------------------
    def _serve(self, text):
        texts, scores, _, _ = self._generate(text, n_best=1)
        return {"translation": tf.reshape(texts, [-1]), "score": tf.reshape(scores, [-1])}

    def _serve_n_best(self, text):
        texts, scores, truncated, unknown = self._generate(text, n_best=self.options.n_best)
        return {"translations": texts, "scores": scores, "truncated": truncated,
                "unknown_fraction": unknown}

    def translate(self, texts: Sequence[str], n_best: bool = False) -> dict[str, np.ndarray]:
        """In-process translation through the very functions that get exported.

        A seed set since the functions were traced (``keras.utils.set_random_seed``) deletes
        the SentencePiece resource they captured; the tokenizer re-creates it (here or in any
        other of its callers), and the functions are traced again, so such a seed cannot
        break a later translation.
        """
        if self.tokenizer.resource_generation() != self._generation:
            self._make_functions()
        fn = self.serve_n_best if n_best else self.serve
        out = fn(tf.constant(list(texts), tf.string))
        return {k: v.numpy() for k, v in out.items()}


# -- layout helpers ----------------------------------------------------------------------------
def latest_export(base_dir: str | os.PathLike, model_name: str) -> Path:
    """The highest version directory of ``model_name``, or ExportError naming what is missing."""
    model_dir = Path(base_dir) / model_name
    versions = list_versions(model_dir)
    if not versions:
        raise ExportError(f"No exported version under {model_dir} (expected integer "
                          "directories such as 1/). Run `aiayn export` first.")
    return model_dir / str(versions[-1])


def models_config_text(base_dir: str | os.PathLike, model_names: Iterable[str]) -> str:
    """``model_config_list`` text proto for ``tensorflow_model_server --model_config_file``."""
    base = Path(base_dir).resolve()
    entries = []
    for name in sorted(set(model_names)):
        entries.append(
            "  config {\n"
            f"    name: \"{name}\"\n"
            f"    base_path: \"{base / name}\"\n"
            "    model_platform: \"tensorflow\"\n"
            "    model_version_policy { latest { num_versions: 1 } }\n"
            "  }\n")
    return "model_config_list {\n" + "".join(entries) + "}\n"


def batching_parameters_text(max_batch_size: int, batch_timeout_micros: int = 5000,
                             num_batch_threads: int | None = None) -> str:
    """``--batching_parameters_file`` text proto (BatchingParameters)."""
    threads = num_batch_threads or max(1, min(8, os.cpu_count() or 1))
    return (f"max_batch_size {{ value: {max_batch_size} }}\n"
            f"batch_timeout_micros {{ value: {batch_timeout_micros} }}\n"
            "max_enqueued_batches { value: 100 }\n"
            f"num_batch_threads {{ value: {threads} }}\n"
            "pad_variable_length_inputs: false\n")


def model_server_command(base_dir: str | os.PathLike, grpc_port: int = 8500,
                         rest_port: int = 8501) -> list[str]:
    """The ``tensorflow_model_server`` command line for an export base directory."""
    base = Path(base_dir).resolve()
    return ["tensorflow_model_server", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
            f"--model_config_file={base / MODELS_CONFIG}",
            "--model_config_file_poll_wait_seconds=60",
            "--file_system_poll_wait_seconds=5",
            "--enable_batching=true", f"--batching_parameters_file={base / BATCHING_FILE}",
            "--enable_model_warmup=true"]


def write_server_configs(base_dir: str | os.PathLike, model_name: str,
                         max_batch_size: int) -> tuple[Path, Path]:
    """Writes ``models.config`` (every model under base_dir) and ``batching_parameters.txt``."""
    base = Path(base_dir)
    names = {p.name for p in base.iterdir() if p.is_dir() and list_versions(p)} | {model_name}
    config = base / MODELS_CONFIG
    batching = base / BATCHING_FILE
    atomic_write(config, models_config_text(base, names))
    atomic_write(batching, batching_parameters_text(max_batch_size))
    return config, batching


# -- the export --------------------------------------------------------------------------------
EXPORT_LOCK = ".export.lock"  # in <base_dir>: held while a version is numbered, written, renamed
_TMP_DIR_RE = re.compile(r"^\.tmp-")


def _next_version(model_dir: Path, requested: int) -> int:
    """The version to write: ``requested``, or the next after the highest (0). Call it under
    the export-base lock (:func:`_new_version`): two exports then get two numbers."""
    existing = list_versions(model_dir)
    if requested < 0:
        raise ExportError(f"`export.version` must be 0 (next) or a positive integer; "
                          f"got {requested}.")
    if requested == 0:
        return (existing[-1] + 1) if existing else 1
    if requested in existing:
        raise ExportError(f"Version {requested} already exists in {model_dir}; versions are "
                          "immutable. Set export.version=0 for the next one "
                          f"({existing[-1] + 1}).")
    return requested


def _remove_export_leftovers(base_dir: Path, model_dir: Path) -> list[Path]:
    """The ``.tmp-*`` directories (and temporary files) of exports that died; under the lock,
    any that exist are dead (every export holds the lock while its directory exists)."""
    removed = remove_leftovers(base_dir) + remove_leftovers(model_dir)
    for p in model_dir.iterdir():
        if p.is_dir() and _TMP_DIR_RE.match(p.name):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _fsync_tree(root: Path) -> None:
    """fsyncs every file and directory under ``root`` (before it is renamed into place)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(dirpath))


@contextlib.contextmanager
def _new_version(base_dir: str | os.PathLike, model_name: str, requested: int,
                 lock_wait_s: float = 600.0,
                 after_publish: Callable[[], Any] | None = None) -> Iterator[tuple[int, Path]]:
    """Numbers, stages and publishes one version under the export-base lock.

    Takes ``<base_dir>/.export.lock`` (waiting up to ``lock_wait_s`` for another export),
    removes the leftovers of killed exports, picks the version and yields ``(version, tmp)``:
    the caller writes the version into ``tmp`` (``<model_dir>/.tmp-<version>-<id>``, absent).
    On a clean exit ``tmp`` is fsynced and renamed to ``<model_dir>/<version>`` and
    ``after_publish`` runs (still under the lock); on an error (or a kill) nothing is published,
    and the next export removes what is left.

    Raises:
      ExportError: another export still holds the lock after ``lock_wait_s`` (named), or
        ``requested`` exists.
    """
    base = Path(base_dir)
    model_dir = base / model_name
    model_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(hold_lock(
                base / EXPORT_LOCK, f"the export base {base}", wait_s=lock_wait_s,
                on_wait=lambda line: print(line, file=sys.stderr, flush=True)))
        except LockHeld as err:
            raise ExportError(str(err)) from None
        _remove_export_leftovers(base, model_dir)
        version = _next_version(model_dir, int(requested))
        tmp = model_dir / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
        try:
            yield version, tmp
            _fsync_tree(tmp)
            fault_point("export:before_rename")
            os.rename(tmp, model_dir / str(version))  # atomic: a server never sees a partial one
            fsync_dir(model_dir)
            if after_publish is not None:
                after_publish()
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def _jsonable(outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    return {key: to_python(value) for key, value in outputs.items()}


def export_saved_model(model: Any, tokenizer: Any, base_dir: str | os.PathLike,
                       model_name: str, *, options: ServingOptions | None = None,
                       version: int = 0, config_yaml: str | None = None,
                       eval_scores: Mapping[str, Any] | None = None,
                       bucket_boundaries: Sequence[int] = (8, 16, 32, 64, 128),
                       sample_texts: Sequence[str] = DEFAULT_SAMPLE_TEXTS,
                       before_publish: Callable[[Path], None] | None = None,
                       lock_wait_s: float = 600.0) -> Path:
    """Writes ``<base_dir>/<model_name>/<version>/`` atomically and the server configs beside it.

    The whole export holds ``<base_dir>/.export.lock``: a second export at the same time waits
    for it (up to ``lock_wait_s``, saying who holds it) and then takes the next version number;
    leftovers of a killed export (``.tmp-*``) are removed first.

    Args:
      model: a built Transformer with trained weights.
      tokenizer: the SubwordTokenizer the model was trained with.
      base_dir: the directory TF Serving watches (holds one folder per model name).
      model_name: servable name, e.g. ``"translate"``.
      options: :class:`ServingOptions` (defaults: beam 4, n-best 4, truncate at 256 tokens).
      version: integer version; 0 takes the next after the highest existing one.
      config_yaml: the resolved run configuration as YAML text (-> ``assets.extra/config.yaml``).
      eval_scores: evaluation scores (-> ``assets.extra/eval_scores.json``).
      bucket_boundaries: token lengths the warmup requests cover.
      sample_texts: sentences translated in-process and stored for the verifier.
      before_publish: called with the complete temporary directory before it is renamed into
        place (e.g. the verifier); if it raises, nothing is published.
      lock_wait_s: how long to wait for another export of the same base to finish.

    Returns:
      The final version directory.

    Raises:
      ExportError: an invalid option, ``version`` already exists, or another export still holds
        the export base after ``lock_wait_s``.
    """
    options = options or ServingOptions()
    if not re.match(r"^[A-Za-z0-9_.\-]+$", model_name or ""):
        raise ExportError(f"Model name {model_name!r} must use letters, digits, '_', '-', '.'.")
    translator = Translator(model, tokenizer, options)
    with _new_version(base_dir, model_name, int(version), lock_wait_s, after_publish=lambda:
                      write_server_configs(base_dir, model_name, options.max_batch_size)
                      ) as (version, tmp):
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.track(tokenizer)
        archive.add_endpoint(SERVING_SIGNATURE, translator.serve)
        archive.add_endpoint(NBEST_SIGNATURE, translator.serve_n_best)
        archive.write_out(str(tmp), verbose=False)

        extra = tmp / "assets.extra"
        extra.mkdir(exist_ok=True)
        texts = warmup_texts(tokenizer, bucket_boundaries, translator.input_limit)
        write_warmup_requests(extra / WARMUP_FILE, model_name, texts,
                              batch_sizes=sorted({1, min(8, options.max_batch_size)}))
        if config_yaml is not None:
            (extra / "config.yaml").write_text(config_yaml, encoding="utf-8")
        (extra / "spm.model").write_bytes(bytes(tokenizer.model_proto))
        if eval_scores is not None:
            (extra / "eval_scores.json").write_text(
                json.dumps(dict(eval_scores), indent=2, default=str), encoding="utf-8")
        samples = list(sample_texts)
        if options.on_long_input == "reject":  # over-long samples would (rightly) be refused
            counts = tokenizer.tokenize(tf.constant(samples or [""], tf.string)).row_lengths()
            samples = [t for t, n in zip(samples, counts.numpy()) if n <= translator.input_limit]
        (extra / SAMPLES_FILE).write_text(json.dumps({
            "texts": samples,
            SERVING_SIGNATURE: _jsonable(translator.translate(samples)),
            NBEST_SIGNATURE: _jsonable(translator.translate(samples, n_best=True)),
            "options": dataclasses.asdict(options),
            "input_limit": translator.input_limit,
        }, indent=2, ensure_ascii=False), encoding="utf-8")
        if before_publish is not None:
            before_publish(tmp)
    return Path(base_dir) / model_name / str(version)
