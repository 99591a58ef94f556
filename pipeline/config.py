"""Typed, frozen run configuration loaded from YAML presets and dotted overrides.

One place maps the paper's symbols to our names (Vaswani et al., 2017, Table 3):

    N      -> model.num_layers          d_model -> model.hidden_dim
              (model.num_decoder_layers, when the decoder's N differs)
    d_ff   -> model.intermediate_dim    h       -> model.num_heads
    P_drop -> model.dropout             eps_ls  -> train.label_smoothing
    warmup_steps (§5.3) -> train.warmup_steps

A configuration is built from presets merged right-most-wins, then ``--set`` overrides::

    cfg = load_config(["small"], overrides=["train.steps=100", "decode.beam_size=1",
                                           "decode.n_best=1"])

Presets are YAML files in ``pipeline/presets/`` (``tiny``, ``small``, ``base``, ``big``), or any
path to a YAML file. Unknown keys are an error that names the valid ones.

Every value is checked when the config is built (:func:`validate`), before any stage runs: each
number against its range (``_BOUNDS``: counts >= 1, or >= 0 where 0 has a documented meaning,
probabilities in [0, 1), floats finite, integers at most 2**31 - 1), required strings non-empty,
and what relates fields to each other, including everything a later stage needs (decode and
export settings, the source limit). A leading ``~`` of a path setting (``data.corpus``,
``data.dev_corpus``, ``data.test_corpus``, ``data.data_dir``, ``train.run_dir``,
``export.base_dir``) is expanded once, here; ``bible``, ``tfds:<name>`` and globs are kept.

Why one module of about 800 lines: it is the configuration's schema, and each field's type,
default, valid range and cross-field rule are read together here; split, a field and its bounds
would live in different files and drift.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from aiayn.models.limits import source_limit as _model_source_limit
from aiayn.models.protect import DEFAULT_PATTERN, PatternError, check_pattern
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_write

PRESET_DIR = Path(__file__).resolve().parent / "presets"


class ConfigError(UserInputError):
    """A configuration file, preset or override is invalid (a user-input error)."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Corpus, vocabulary and tf.data settings."""

    # "bible" builds the default English->Spanish corpus from Debian's SWORD modules; otherwise a
    # path (TSV, `prefix` of line-aligned files, TFRecord glob) or `tfds:<name>`.
    corpus: str = "bible"
    # tsv | text | tfrecord | tfds | auto (guessed from the path).
    format: str = "auto"
    # Held-out splits for a user corpus (same formats). Empty: `heldout_size` pairs each are
    # drawn (seeded) from `corpus` for dev and test. Ignored for "bible" (fixed book split).
    dev_corpus: str = ""
    test_corpus: str = ""
    heldout_size: int = 1000
    source_lang: str = "en"
    target_lang: str = "es"
    data_dir: str = "data"
    # Bad lines: "error" stops with the file, line and fix; "skip" drops and counts them.
    on_error: str = "error"
    # Pairs whose longer side is more than this many times as long as the shorter one are absurd;
    # lengths are characters weighted by script (a Han character counts 3.5 Latin letters,
    # pipeline/data/languages.py), so real Chinese/Japanese/Korean-Latin pairs pass.
    max_length_ratio: float = 3.0
    # More English versions of the training books (SWORD modules: engKJV2006eb, Debian
    # sword-text-kjv), each paired with the same Spanish verses; dev and test stay the WEB's.
    # Ignored unless data.corpus is "bible".
    bible_extra_sources: tuple[str, ...] = ()
    # SentencePiece (joint source+target vocabulary). `char`: one piece per character.
    vocab_size: int = 8000
    vocab_model_type: str = "unigram"
    # 0 = by language: 0.9995 when a side is zh/ja/ko (SentencePiece's advice for rich character
    # sets; the rarest characters become <unk>), else 1.0 (every character gets a piece).
    character_coverage: float = 0.0
    vocab_sample_size: int = 2_000_000
    # The pieces the decoder may produce: joint (all of the shared vocabulary, the paper) or
    # target (the specials and the pieces of the training split's target side; the training
    # projection, softmax and loss then cover those only: pipeline/data/vocab.py output_ids).
    output_vocabulary: str = "joint"
    # Subword regularisation of the training batches (Kudo, 2018; BPE-dropout for a bpe
    # vocabulary): each epoch segments every pair anew, sampled with inverse temperature
    # `subword_alpha` (0 = off: the one best segmentation, as dev, test and the export always
    # use) from its `subword_nbest` best segmentations (-1 = all). The length filter then sees
    # each epoch's sampled lengths; the counts the run reports are of the best segmentation.
    subword_alpha: float = 0.0
    subword_nbest: int = -1
    # Data augmentation by concatenation (Nguyen et al., 2021): the probability that two
    # consecutive training examples of the shuffled stream are joined into one longer pair
    # (when it fits max_length). 0 = off; dev, test and the export never join.
    concat_fraction: float = 0.0
    # tf.data
    max_length: int = 128
    token_budget: int = 4096
    # A small fixed set, so batch shapes repeat (XLA compiles each once); fine enough that
    # real/padded tokens stays >= 0.90 on verse-like length distributions.
    bucket_boundaries: tuple[int, ...] = (8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80, 88,
                                          96, 104, 112, 120, 128)
    shuffle_buffer: int = 20000
    seed: int = 1234


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The Transformer's hyper-parameters (paper Table 3)."""

    num_layers: int = 6
    hidden_dim: int = 512
    intermediate_dim: int = 2048
    num_heads: int = 8
    dropout: float = 0.1
    attention_dropout: float = 0.0
    norm_first: bool = False
    tie_embeddings: bool = True
    max_position: int = 1024
    layer_norm_epsilon: float = 1e-6
    # 0 = as many as num_layers (the paper); fewer: a deep encoder and a shallow decoder.
    num_decoder_layers: int = 0
    # relu (the paper), gelu, or gated (Shazeer, 2020): swiglu, geglu, whose inner layer is
    # 2 * intermediate_dim wide (two thirds of the ReLU width keeps the parameters and FLOPs).
    ffn_activation: str = "relu"
    # Word dropout (Sennrich & Zhang, 2019): the share of source and target tokens whose whole
    # embedding is zeroed in training (switched with model.dropout by train.late_dropout).
    token_dropout: float = 0.0

    @property
    def decoder_layers(self) -> int:
        """The decoder's depth, with 0 resolved (``Transformer.num_decoder_layers``)."""
        return self.num_decoder_layers or self.num_layers


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training recipe (paper §5) and the run's mechanics."""

    run_dir: str = "runs/default"
    steps: int = 100000
    max_minutes: float = 0.0  # 0 = no time budget
    # The whole job (`aiayn run`; `make train` from the start of its set-up) ends within this
    # many minutes: the time budget is what is left after the stages before training and a
    # reserve, timed on the machine, for those after it; train.max_minutes bounds it (0 = none).
    deadline_minutes: float = 0.0
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    # rsqrt: the paper's inverse square root (models.schedule.TransformerSchedule); budget:
    # the same warm-up, then a linear decay to zero where the run stops (train.steps or the
    # time budget, whichever ends it first; models.schedule.BudgetSchedule);
    # rsqrt_cooldown: the inverse square root, then that decay over the last decay_fraction.
    lr_schedule: str = "rsqrt"
    # budget, rsqrt_cooldown: the final share of the run over which lr falls to 0.
    decay_fraction: float = 1.0
    # budget, rsqrt_cooldown: the decay's curve, linear or sqrt (1 - sqrt of its elapsed share).
    decay_shape: str = "linear"
    # budget: the warm-up also ends after this share of the run (0 = warmup_steps only).
    warmup_fraction: float = 0.0
    # The share of the run (of train.steps, or of the time budget if further along) trained
    # without dropout before model.dropout (and attention_dropout) switch on; 0 = from the start.
    late_dropout: float = 0.0
    beta_1: float = 0.9
    beta_2: float = 0.98
    epsilon: float = 1e-9
    label_smoothing: float = 0.1
    gradient_accumulation_steps: int = 1
    clipnorm: float = 0.0  # 0 = off (the paper does not clip)
    jit_compile: str = "auto"  # auto | true | false
    mixed_precision: str = "auto"  # auto | float32 | mixed_float16 | mixed_bfloat16
    distribute: str = "auto"  # auto | default | mirrored | multi_worker | tpu
    steps_per_epoch: int = 500
    checkpoint_every: int = 1000
    keep_checkpoints: int = 5
    average_last: int = 5
    # An exponential moving average of the weights (Keras's optimizer EMA, updated every step):
    # its momentum, and at the end of training the average is a further candidate for the
    # final weights (checkpoints/ema-<step>.weights.h5); 0 = off.
    ema_momentum: float = 0.0
    # Dev BLEU points by which the average or the best-dev weights must beat the last
    # checkpoint to replace it as final.weights.h5; 0 = the highest score wins.
    selection_margin: float = 0.0
    # Dev pairs (evenly spaced) on which those candidates are scored; 0 = the whole dev split.
    selection_max_sentences: int = 0
    eval_every: int = 2000
    eval_max_sentences: int = 500
    dev_loss_every: int = 250  # teacher-forced loss on the same dev sample; 0 = off
    # sacreBLEU's BLEU tokenizer; auto = by data.target_lang (zh -> zh, ja -> ja-mecab, or char
    # without MeCab, th/lo/km/my -> char, else 13a): pipeline/training/metrics.py.
    bleu_tokenize: str = "auto"
    early_stopping_patience: int = 0  # evaluations without dev BLEU gain; 0 = off
    seed: int = 1234
    deterministic: bool = False


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Search settings (paper §6.1: beam 4, length penalty alpha 0.6, max length input + 50)."""

    beam_size: int = 4
    length_penalty: float = 0.6
    max_extra_length: int = 50
    n_best: int = 4
    batch_size: int = 64
    # When a sentence's search stops (models/decoding.py): "current" (its best finished beats
    # every alive beam at its current length; CTranslate2's and Hugging Face's default kind)
    # or "bound" (beats what any alive beam could still reach; 1.4x the decoding time).
    stop_rule: str = "current"


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """SavedModel export and serving."""

    base_dir: str = "exports"
    model_name: str = "translate"
    version: int = 0  # 0 = next integer after the highest existing version
    max_input_tokens: int = 256
    on_long_input: str = "truncate"  # truncate | reject
    max_batch_size: int = 64
    # Spans passed through untranslated (placeholders, options, numbers, URLs, markup:
    # models/protect.py), in the export, evaluation and the CTranslate2 engine; "" = off.
    protect_pattern: str = DEFAULT_PATTERN


@dataclasses.dataclass(frozen=True)
class TfxConfig:
    """The TFX pipeline's push gate (pipeline/tfx/blessing.py): what a model must score on
    ExampleGen's eval split (sacreBLEU BLEU, 0-100) before the Pusher may push it."""

    # Every pushed model reaches at least this BLEU (catches a diverged or empty model).
    bleu_floor: float = 1.0
    # A new model may score at most this many BLEU points below the last blessed model.
    bleu_margin: float = 1.0
    # Eval sentences translated by each model (the first N of the split); 0 = all of them.
    eval_sentences: int = 500


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole run configuration."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)
    export: ExportConfig = dataclasses.field(default_factory=ExportConfig)
    tfx: TfxConfig = dataclasses.field(default_factory=TfxConfig)
    preset: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A plain, YAML-serialisable dict (tuples become lists)."""
        return _to_plain(dataclasses.asdict(self))

    def replace(self, **sections: Any) -> Config:
        return dataclasses.replace(self, **sections)


_SECTIONS = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "preset"}
_SECTION_CLASSES = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "decode": DecodeConfig,
    "export": ExportConfig,
    "tfx": TfxConfig,
}

_VALID_CHOICES = {
    ("data", "format"): ("auto", "tsv", "text", "tfrecord", "tfds"),
    ("data", "on_error"): ("error", "skip"),
    ("data", "vocab_model_type"): ("unigram", "bpe", "char", "word"),
    ("data", "output_vocabulary"): ("joint", "target"),
    # pipeline.data.bible.extract.EXTRA_SOURCE_MODULES (the SWORD modules Debian packages).
    ("data", "bible_extra_sources"): ("engKJV2006eb",),
    # sacreBLEU tokenizers that need no download (not flores101/200, spm).
    ("train", "bleu_tokenize"): ("auto", "13a", "intl", "zh", "ja-mecab", "ko-mecab", "char",
                                 "none"),
    ("train", "lr_schedule"): ("rsqrt", "budget", "rsqrt_cooldown"),
    # aiayn.models.schedule.BudgetSchedule.SHAPES, spelled out (importing it would load Keras).
    ("train", "decay_shape"): ("linear", "sqrt"),
    ("train", "jit_compile"): ("auto", "true", "false"),
    ("train", "mixed_precision"): ("auto", "float32", "mixed_float16", "mixed_bfloat16"),
    ("train", "distribute"): ("auto", "default", "mirrored", "multi_worker", "tpu"),
    # aiayn.models.feedforward.ACTIVATIONS and GATED_ACTIVATIONS, spelled out (as above).
    ("model", "ffn_activation"): ("relu", "gelu", "swiglu", "geglu"),
    ("export", "on_long_input"): ("truncate", "reject"),
    # aiayn.models.decoding.STOP_RULES, spelled out: importing it would load Keras with the config.
    ("decode", "stop_rule"): ("current", "bound"),
}

# The largest integer a count or length may have (TensorFlow holds lengths, boundaries and
# budgets as int32); seeds go up to 2**32 - 1 (NumPy's and SentencePiece's range).
_INT_MAX = 2**31 - 1
_SEED_MAX = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class _Bound:
    """The valid range of a numeric field: ``low``/``high`` (inclusive unless ``*_open``), and
    ``zero``: what 0 means, where 0 is valid although below ``low`` (or documents what 0 means)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    zero: str = ""

    def allows(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.zero and value == 0:
            return True
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        high = self.high if self.high is not None else (
            _INT_MAX if isinstance(value, int) else None)
        return high is None or (value < high if self.high_open else value <= high)

    def text(self, integer: bool, value: Any = None) -> str:
        """E.g. ``an integer >= 1``, ``a finite number in [0, 1)``, ``an integer >= 0 (0 = off)``.
        """
        kind = "an integer" if integer else "a finite number"
        high = self.high
        if high is None and integer and isinstance(value, int) and value > _INT_MAX:
            high = _INT_MAX  # only worth naming when it is what the value broke
        low = _num(self.low) if self.low is not None else None
        if low is not None and high is not None:
            rng = (f"in {'(' if self.low_open else '['}{low}, {_num(high)}"
                   f"{')' if self.high_open else ']'}")
        elif low is not None:
            rng = f"{'>' if self.low_open else '>='} {low}"
        else:
            rng = f"{'<' if self.high_open else '<='} {_num(high)}"
        if self.zero and self.low is not None and self.low > 0:
            return f"{kind}: 0 ({self.zero}) or {rng}"
        if self.zero:
            return f"{kind} {rng} (0 = {self.zero})"
        return f"{kind} {rng}"


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_AT_LEAST_1 = _Bound(1)
_PROBABILITY = _Bound(0.0, 1.0, high_open=True)
_POSITIVE = _Bound(0.0, low_open=True)
_SEED = _Bound(0, _SEED_MAX)

# Every numeric field's valid range, checked at load (tests/test_config.py checks that every int
# and float field has one). Where 0 has a documented meaning, `zero` says which.
_BOUNDS: dict[tuple[str, str], _Bound] = {
    ("data", "heldout_size"): _Bound(0),  # >= 1 where it is used: see validate()
    ("data", "max_length_ratio"): _Bound(1.0, zero="no length-ratio check"),
    ("data", "vocab_size"): _Bound(5),  # the 4 special pieces and at least one more
    ("data", "character_coverage"): _Bound(0.98, 1.0, zero="by language"),  # SentencePiece's
    ("data", "vocab_sample_size"): _Bound(0, zero="every sentence"),
    ("data", "subword_alpha"): _Bound(0.0, zero="no sampling"),
    ("data", "subword_nbest"): _Bound(-1),  # -1 = all; 0 and 1 (no sampling): validate()
    ("data", "concat_fraction"): _Bound(0.0, 1.0, zero="off"),
    ("data", "max_length"): _Bound(2),  # BOS + one target token
    ("data", "token_budget"): _AT_LEAST_1,
    ("data", "bucket_boundaries"): _AT_LEAST_1,  # each boundary
    ("data", "shuffle_buffer"): _AT_LEAST_1,  # 1 = no shuffling
    ("data", "seed"): _SEED,
    ("model", "num_layers"): _AT_LEAST_1,
    ("model", "num_decoder_layers"): _Bound(0, zero="as many as model.num_layers"),
    ("model", "hidden_dim"): _AT_LEAST_1,
    ("model", "intermediate_dim"): _AT_LEAST_1,
    ("model", "num_heads"): _AT_LEAST_1,
    ("model", "dropout"): _PROBABILITY,
    ("model", "attention_dropout"): _PROBABILITY,
    ("model", "token_dropout"): _PROBABILITY,
    ("model", "max_position"): _AT_LEAST_1,
    ("model", "layer_norm_epsilon"): _POSITIVE,
    ("train", "steps"): _AT_LEAST_1,
    ("train", "max_minutes"): _Bound(0.0, zero="no time budget"),
    ("train", "deadline_minutes"): _Bound(0.0, zero="no deadline"),
    ("train", "warmup_steps"): _AT_LEAST_1,
    ("train", "learning_rate_scale"): _POSITIVE,
    ("train", "decay_fraction"): _Bound(0.0, 1.0, low_open=True),
    ("train", "late_dropout"): _PROBABILITY,
    ("train", "warmup_fraction"): _Bound(0.0, 1.0, high_open=True),
    ("train", "beta_1"): _PROBABILITY,
    ("train", "beta_2"): _PROBABILITY,
    ("train", "epsilon"): _POSITIVE,
    ("train", "label_smoothing"): _PROBABILITY,
    ("train", "gradient_accumulation_steps"): _AT_LEAST_1,
    ("train", "clipnorm"): _Bound(0.0, zero="no clipping"),
    ("train", "steps_per_epoch"): _AT_LEAST_1,
    ("train", "checkpoint_every"): _AT_LEAST_1,
    ("train", "keep_checkpoints"): _AT_LEAST_1,
    ("train", "average_last"): _AT_LEAST_1,
    ("train", "ema_momentum"): _Bound(0.0, 1.0, low_open=True, high_open=True, zero="off"),
    ("train", "selection_margin"): _Bound(0.0, 100.0),  # BLEU points
    ("train", "eval_every"): _Bound(0, zero="no dev evaluation"),
    ("train", "eval_max_sentences"): _Bound(0, zero="the whole dev split"),
    ("train", "selection_max_sentences"): _Bound(0, zero="the whole dev split"),
    ("train", "dev_loss_every"): _Bound(0, zero="no dev loss"),
    ("train", "early_stopping_patience"): _Bound(0, zero="off"),
    ("train", "seed"): _SEED,
    ("decode", "beam_size"): _AT_LEAST_1,  # 1 = greedy search
    ("decode", "length_penalty"): _Bound(0.0),
    ("decode", "max_extra_length"): _Bound(0),
    ("decode", "n_best"): _AT_LEAST_1,  # <= decode.beam_size: see validate()
    ("decode", "batch_size"): _AT_LEAST_1,
    ("export", "version"): _Bound(0, 2**63 - 1, zero="the next version"),
    ("export", "max_input_tokens"): _AT_LEAST_1,
    ("export", "max_batch_size"): _AT_LEAST_1,
    ("tfx", "bleu_floor"): _Bound(0.0, 100.0),  # BLEU points (sacreBLEU's 0-100 scale)
    ("tfx", "bleu_margin"): _Bound(0.0, 100.0),
    ("tfx", "eval_sentences"): _Bound(0, zero="the whole eval split"),
}

# Path fields: a leading `~` is expanded once, when the config is built (build_config).
_PATH_FIELDS = (("data", "corpus"), ("data", "dev_corpus"), ("data", "test_corpus"),
                ("data", "data_dir"), ("train", "run_dir"), ("export", "base_dir"))
# Settings that must not be empty, and why.
_REQUIRED_STRINGS = {
    ("data", "corpus"): "a corpus: 'bible', a path, a glob or tfds:<name>",
    ("data", "data_dir"): "a directory for the prepared data",
    ("data", "source_lang"): "a language code, e.g. en",
    ("data", "target_lang"): "a language code, e.g. es",
    ("train", "run_dir"): "a run directory",
    ("export", "base_dir"): "the directory exports go to",
    ("export", "model_name"): "a model name, e.g. translate",
}
# As export/saved_model.py requires (a directory name and a URL path segment).
_MODEL_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def available_presets() -> list[str]:
    """Names of the presets shipped in ``pipeline/presets/``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _read_preset(name: str) -> dict[str, Any]:
    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = PRESET_DIR / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(
            f"Unknown preset {name!r}. Valid presets: {', '.join(available_presets())}, "
            "or a path to a .yaml file."
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:  # one line: where, and what the parser expected
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(getattr(err, "problem", None) or err).split())
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}. Fix the file's syntax."
                          ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}.")
    data.pop("preset", None)
    _check_keys(data, str(path))
    return data


def _check_keys(data: Mapping[str, Any], origin: str) -> None:
    for section, values in data.items():
        if section not in _SECTION_CLASSES:
            raise ConfigError(
                f"{origin}: unknown section {section!r}. Valid sections: "
                f"{', '.join(_SECTION_CLASSES)}."
            )
        if not isinstance(values, dict):
            raise ConfigError(f"{origin}: section {section!r} must be a mapping.")
        valid = [f.name for f in dataclasses.fields(_SECTION_CLASSES[section])]
        for key in values:
            if key not in valid:
                raise ConfigError(
                    f"{origin}: unknown key {section}.{key}. Valid keys of {section!r}: "
                    f"{', '.join(valid)}."
                )


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) for k, v in base.items()}
    for section, values in update.items():
        out.setdefault(section, {}).update(values)
    return out


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _expected(section: str, key: str, integer: bool) -> str:
    bound = _BOUNDS.get((section, key))
    if bound is None:
        return "an integer" if integer else "a finite number"
    return bound.text(integer)


def _coerce(section: str, key: str, value: Any, typ: Any, origin: str) -> Any:
    """Converts a YAML or command-line value to the field's declared type, or raises."""
    where = f"{origin}: `{section}.{key}`"
    if typing.get_origin(typ) is tuple:
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list; got {value!r}.")
        (item_type, _) = typing.get_args(typ)
        return tuple(_coerce(section, key, v, item_type, origin) for v in value)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where} must be true or false; got {value!r}.")
    if typ is int:
        return _coerce_int(value, where, _expected(section, key, integer=True))
    if typ is float:
        return _coerce_float(value, where, _expected(section, key, integer=False))
    if typ is str:
        return _coerce_choice(value, where, _VALID_CHOICES.get((section, key)))
    raise ConfigError(f"{where}: unsupported type {typ!r}.")  # pragma: no cover


def _coerce_int(value: Any, where: str, expected: str) -> int:
    """An int from an int, a digit string of any length, or a float-like whole number."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be {expected}; got {value!r}.")
    if isinstance(value, int):
        return value
    text = value.strip().replace("_", "") if isinstance(value, str) else value
    if isinstance(text, str) and re.fullmatch(r"[+-]?\d+", text):
        return int(text)  # exactly, however long (the range check follows in validate)
    as_float = _finite_float(text, value, where, expected)
    if as_float != int(as_float):
        raise ConfigError(f"{where} must be {expected} (a whole number); got {value!r}.")
    return int(as_float)


def _coerce_float(value: Any, where: str, expected: str) -> float:
    """A finite float from a number or a numeric string (never from a bool)."""
    if isinstance(value, bool):
        raise ConfigError(f"{where} must be {expected}; got {value!r}.")
    return _finite_float(value.strip() if isinstance(value, str) else value, value, where,
                         expected)


def _finite_float(text: Any, value: Any, where: str, expected: str) -> float:
    """`float(text)`, or a ConfigError naming `value` when it is not a finite number."""
    try:
        number = float(text)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{where} must be {expected}; got {value!r}.") from None
    if not math.isfinite(number):  # "1e400" parses to inf
        raise ConfigError(f"{where} must be {expected}; got {value!r}, which is not a finite "
                          "number.")
    return number


def _coerce_choice(value: Any, where: str, choices: Sequence[str] | None) -> str:
    """A string (YAML's bools and numbers written back as text), one of `choices` if given."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    if not isinstance(value, (str, int, float)):
        raise ConfigError(f"{where} must be a string; got {value!r}.")
    value = str(value)
    if choices and value not in choices:
        raise ConfigError(f"{where} must be one of {', '.join(choices)}; got {value!r}.")
    return value


def parse_override(text: str) -> tuple[str, str, Any]:
    """Parses ``section.key=value`` into its parts (value still a string)."""
    if "=" not in text:
        raise ConfigError(
            f"Override {text!r} must look like section.key=value, e.g. train.steps=100."
        )
    dotted, value = text.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) != 2:
        raise ConfigError(
            f"Override {text!r}: the key must be section.key (sections: "
            f"{', '.join(_SECTION_CLASSES)}), e.g. train.steps=100."
        )
    return parts[0], parts[1], value.strip()


def build_config(values: Mapping[str, Mapping[str, Any]], origin: str = "config",
                 preset: str = "") -> Config:
    """Builds a validated :class:`Config` from a ``{section: {key: value}}`` mapping."""
    _check_keys(values, origin)
    sections = {}
    for section, cls in _SECTION_CLASSES.items():
        types = _field_types(cls)
        given = values.get(section, {})
        kwargs = {k: _coerce(section, k, v, types[k], origin) for k, v in given.items()}
        for k, v in kwargs.items():
            if (section, k) in _PATH_FIELDS:
                kwargs[k] = expand_path_setting(v)
        sections[section] = cls(**kwargs)
    cfg = Config(preset=preset, **sections)
    validate(cfg)
    return cfg


def load_config(presets: Sequence[str] | str = ("small",),
                overrides: Sequence[str] = ()) -> Config:
    """Merges presets right-most-wins, applies dotted overrides, validates.

    Args:
      presets: preset names (``tiny``, ``small``, ``base``, ``big``) or YAML paths.
      overrides: ``section.key=value`` strings, applied after every preset.

    Returns:
      A frozen :class:`Config`.

    Raises:
      ConfigError: unknown preset, section or key (naming the valid ones), a value of the wrong
        type, or an inconsistent setting.
    """
    if isinstance(presets, str):
        presets = [presets]
    merged: dict[str, Any] = {}
    for name in presets:
        merged = _merge(merged, _read_preset(name))
    for text in overrides:
        section, key, value = parse_override(text)
        _check_keys({section: {key: value}}, "--set")
        merged = _merge(merged, {section: {key: value}})
    return build_config(merged, origin="config", preset="+".join(presets))


def expand_path_setting(value: str) -> str:
    """Expands a leading ``~`` of a path setting (each part of ``a,b``); keeps ``bible``,
    ``tfds:<name>`` and glob characters as they are."""
    if not value or value == "bible" or value.startswith("tfds:") or "~" not in value:
        return value
    if "," in value:
        return ",".join(os.path.expanduser(part.strip()) if part.strip().startswith("~")
                        else part for part in value.split(","))
    return os.path.expanduser(value)


def _check_ranges(cfg: Config) -> None:
    """Every numeric field inside its range (``_BOUNDS``); every required string non-empty."""
    for section, cls in _SECTION_CLASSES.items():
        values = getattr(cfg, section)
        for name, typ in _field_types(cls).items():
            value, field = getattr(values, name), f"{section}.{name}"
            bound = _BOUNDS.get((section, name))
            if bound is not None:
                integer = typ is int or typing.get_origin(typ) is tuple
                for item in (value if isinstance(value, tuple) else (value,)):
                    if bound.allows(item):
                        continue
                    got = _num(item) if isinstance(item, float) else item
                    if isinstance(value, tuple):
                        raise ConfigError(f"`{field}`: each entry must be "
                                          f"{bound.text(integer, item)}; got {got} in "
                                          f"{list(value)}.")
                    raise ConfigError(f"`{field}` must be {bound.text(integer, item)}; got {got}.")
            need = _REQUIRED_STRINGS.get((section, name))
            if need and not str(value).strip():
                raise ConfigError(f"`{field}` must not be empty: give {need}.")


def validate(cfg: Config) -> None:
    """Checks every value at load: each field's range, then what relates fields to each other.

    Everything a later stage needs (decode and export settings, the source limit) is checked
    here, so a bad setting fails before any data is prepared or any step trained.

    Raises:
      ConfigError: the first bad setting, naming the field, the value and the valid range.
    """
    _check_ranges(cfg)  # before the divisions below
    try:
        check_pattern(cfg.export.protect_pattern, re2=False)
    except PatternError as err:
        raise ConfigError(f"`export.protect_pattern`: {err}") from None
    _check_model(cfg.model)
    _check_batching(cfg.data)
    _check_corpus(cfg.data)
    _check_outputs(cfg)
    source_limit(cfg)


def _check_model(m: ModelConfig) -> None:
    """The model's shape: heads that divide the width, a width the sinusoids can use."""
    if m.hidden_dim % m.num_heads:
        raise ConfigError(
            "`model.num_heads` must divide `model.hidden_dim`. Received: "
            f"hidden_dim={m.hidden_dim}, num_heads={m.num_heads}."
        )
    if m.hidden_dim % 2:
        raise ConfigError(
            f"`model.hidden_dim` must be even for the sinusoidal encoding; got {m.hidden_dim}."
        )


def _check_batching(d: DataConfig) -> None:
    """What the training batches need: the longest pair fits, sampling that samples, buckets."""
    if d.token_budget < d.max_length:
        raise ConfigError(
            f"`data.token_budget` ({d.token_budget}) must be at least `data.max_length` "
            f"({d.max_length}) so that the longest pair fits in a batch."
        )
    if d.subword_alpha > 0 and d.subword_nbest in (0, 1):
        raise ConfigError(
            f"`data.subword_nbest` is {d.subword_nbest}, which samples nothing: use -1 (every "
            "segmentation) or a count >= 2 with `data.subword_alpha` > 0, or set "
            "`data.subword_alpha=0` to turn subword sampling off.")
    if d.subword_alpha > 0 and d.output_vocabulary == "target":
        raise ConfigError(
            "`data.output_vocabulary=target` keeps the pieces of the training targets' best "
            "segmentation, and `data.subword_alpha` > 0 samples others into the labels: set "
            "`data.output_vocabulary=joint` with subword sampling, or `data.subword_alpha=0`.")
    bounds = d.bucket_boundaries
    if list(bounds) != sorted(set(bounds)):
        raise ConfigError(
            f"`data.bucket_boundaries` must be strictly increasing positive integers; got {bounds}."
        )


def _check_corpus(d: DataConfig) -> None:
    """The languages and the corpus: codes, the Bible's pair, the held-out splits."""
    for name in ("source_lang", "target_lang"):
        code = getattr(d, name)
        if not re.fullmatch(r"[A-Za-z0-9_.@-]+", code):
            raise ConfigError(f"`data.{name}` must be a language code such as en, pt-BR or "
                              f"sr@latin (no spaces or slashes); got {code!r}.")
    if d.corpus == "bible" and (d.source_lang.lower(), d.target_lang.lower()) != ("en", "es"):
        raise ConfigError(
            f"`data.corpus` is 'bible', the English->Spanish default corpus, but the languages "
            f"are data.source_lang={d.source_lang!r}, data.target_lang={d.target_lang!r}. Give "
            "your own corpus (e.g. --set data.corpus=my.tsv; README: Your own data), or set "
            "the languages back to en and es.")
    if len(set(d.bible_extra_sources)) != len(d.bible_extra_sources):
        raise ConfigError(f"`data.bible_extra_sources` names a module twice: "
                          f"{list(d.bible_extra_sources)}. Name each once.")
    if d.corpus != "bible":
        if bool(d.dev_corpus) != bool(d.test_corpus):
            raise ConfigError(
                "`data.dev_corpus` and `data.test_corpus` go together: give both, or neither "
                f"(then data.heldout_size pairs each are held out); got dev_corpus="
                f"{d.dev_corpus!r}, test_corpus={d.test_corpus!r}.")
        if not d.dev_corpus and d.heldout_size < 1:
            raise ConfigError(
                f"`data.heldout_size` must be an integer >= 1 when data.dev_corpus and "
                f"data.test_corpus are not given (it is the size of each of dev and test); "
                f"got {d.heldout_size}.")


def _check_outputs(cfg: Config) -> None:
    """What training, decoding and the export write: averaged checkpoints, n-best, the name."""
    t = cfg.train
    if t.average_last > t.keep_checkpoints:
        raise ConfigError(
            f"`train.average_last` ({t.average_last}) cannot exceed `train.keep_checkpoints` "
            f"({t.keep_checkpoints}): only the last {t.keep_checkpoints} checkpoints are kept. "
            "Raise train.keep_checkpoints or lower train.average_last.")
    if cfg.decode.n_best > cfg.decode.beam_size:
        raise ConfigError(
            f"`decode.n_best` ({cfg.decode.n_best}) cannot exceed `decode.beam_size` "
            f"({cfg.decode.beam_size})."
        )
    name = cfg.export.model_name
    if not _MODEL_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(f"`export.model_name` must use letters, digits, '_', '-' and '.' "
                          f"(a directory name and a URL path segment); got {name!r}.")


def source_limit(cfg: Config) -> int:
    """The most source tokens any path feeds the encoder (training excepted, which drops).

    Evaluation, dev BLEU, checkpoint choice, ``translate --explain``, the export and the
    development server all truncate (or, for the export, reject) at this one limit:
    ``export.max_input_tokens``, capped so that decoding stays inside ``model.max_position``
    (:func:`aiayn.models.limits.source_limit`).

    Raises:
      ConfigError: the settings leave no room for a source token.
    """
    try:
        return _model_source_limit(cfg.export.max_input_tokens, cfg.model.max_position,
                                   cfg.decode.max_extra_length)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def config_text(cfg: Config) -> str:
    """The resolved config as YAML (what :func:`read_config` reads back)."""
    return (f"# Resolved configuration (preset: {cfg.preset or 'none'}).\n"
            + yaml.safe_dump({"preset": cfg.preset, **cfg.to_dict()}, sort_keys=False,
                             allow_unicode=True))


def write_config(cfg: Config, path: str | os.PathLike) -> Path:
    """Writes the resolved config as YAML atomically (temporary file, then rename)."""
    return atomic_write(path, config_text(cfg))


def read_config(path: str | os.PathLike) -> Config:
    """Reads a config written by :func:`write_config` (e.g. from a run directory)."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    preset = data.pop("preset", "") or ""
    return build_config(data, origin=str(path), preset=preset)
