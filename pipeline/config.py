"""Typed, frozen run configuration loaded from YAML presets and dotted overrides.

One place maps the paper's symbols to our names (Vaswani et al., 2017, Table 3):

    N      -> model.num_layers          d_model -> model.hidden_dim
    d_ff   -> model.intermediate_dim    h       -> model.num_heads
    P_drop -> model.dropout             eps_ls  -> train.label_smoothing
    warmup_steps (§5.3) -> train.warmup_steps

A configuration is built from presets merged right-most-wins, then ``--set`` overrides::

    cfg = load_config(["small"], overrides=["train.steps=100", "decode.beam_size=1"])

Presets are YAML files in ``pipeline/presets/`` (``tiny``, ``small``, ``base``, ``big``), or any
path to a YAML file. Unknown keys are an error that names the valid ones.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from aiayn.models.limits import source_limit as _model_source_limit
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
    # Pairs whose longer side has more than this many characters per the shorter side's are absurd.
    max_length_ratio: float = 3.0
    # SentencePiece (joint source+target vocabulary).
    vocab_size: int = 8000
    vocab_model_type: str = "unigram"
    character_coverage: float = 1.0
    vocab_sample_size: int = 2_000_000
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


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training recipe (paper §5) and the run's mechanics."""

    run_dir: str = "runs/default"
    steps: int = 100000
    max_minutes: float = 0.0  # 0 = no time budget
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
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
    eval_every: int = 2000
    eval_max_sentences: int = 500
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


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """SavedModel export and serving."""

    base_dir: str = "exports"
    model_name: str = "translate"
    version: int = 0  # 0 = next integer after the highest existing version
    max_input_tokens: int = 256
    on_long_input: str = "truncate"  # truncate | reject
    max_batch_size: int = 64


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole run configuration."""

    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)
    export: ExportConfig = dataclasses.field(default_factory=ExportConfig)
    preset: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A plain, YAML-serialisable dict (tuples become lists)."""
        return _to_plain(dataclasses.asdict(self))

    def replace(self, **sections: Any) -> "Config":
        return dataclasses.replace(self, **sections)


_SECTIONS = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "preset"}
_SECTION_CLASSES = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "decode": DecodeConfig,
    "export": ExportConfig,
}

_VALID_CHOICES = {
    ("data", "format"): ("auto", "tsv", "text", "tfrecord", "tfds"),
    ("data", "on_error"): ("error", "skip"),
    ("data", "vocab_model_type"): ("unigram", "bpe", "char", "word"),
    ("train", "jit_compile"): ("auto", "true", "false"),
    ("train", "mixed_precision"): ("auto", "float32", "mixed_float16", "mixed_bfloat16"),
    ("train", "distribute"): ("auto", "default", "mirrored", "multi_worker", "tpu"),
    ("export", "on_long_input"): ("truncate", "reject"),
}


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


def _coerce(section: str, key: str, value: Any, typ: Any, origin: str) -> Any:
    """Converts a YAML or command-line value to the field's declared type, or raises."""
    where = f"{origin}: {section}.{key}"
    if typing.get_origin(typ) is tuple:
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}.")
        (item_type, _) = typing.get_args(typ)
        return tuple(_coerce(section, key, v, item_type, origin) for v in value)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where} must be true or false, got {value!r}.")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be an integer, got {value!r}.")
        try:
            if isinstance(value, str):
                value = value.replace("_", "")
            as_float = float(value)
            if as_float != int(as_float):
                raise ValueError
            return int(as_float)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be an integer, got {value!r}.") from None
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, got {value!r}.")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a number, got {value!r}.") from None
    if typ is str:
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{where} must be a string, got {value!r}.")
        value = str(value)
        choices = _VALID_CHOICES.get((section, key))
        if choices and value not in choices:
            raise ConfigError(f"{where} must be one of {', '.join(choices)}; got {value!r}.")
        return value
    raise ConfigError(f"{where}: unsupported type {typ!r}.")  # pragma: no cover


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


def validate(cfg: Config) -> None:
    """Cross-field checks that a single field's type cannot express."""
    m = cfg.model
    for name, value in (("model.num_layers", m.num_layers), ("model.hidden_dim", m.hidden_dim),
                        ("model.intermediate_dim", m.intermediate_dim),
                        ("model.num_heads", m.num_heads), ("data.vocab_size", cfg.data.vocab_size),
                        ("data.token_budget", cfg.data.token_budget),
                        ("data.max_length", cfg.data.max_length),
                        ("train.steps", cfg.train.steps),
                        ("train.steps_per_epoch", cfg.train.steps_per_epoch),
                        ("decode.beam_size", cfg.decode.beam_size),
                        ("decode.batch_size", cfg.decode.batch_size),
                        ("export.max_batch_size", cfg.export.max_batch_size),
                        ("train.gradient_accumulation_steps",
                         cfg.train.gradient_accumulation_steps)):
        if value < 1:  # before the divisions below
            raise ConfigError(f"`{name}` must be at least 1; got {value}.")
    if m.hidden_dim % m.num_heads:
        raise ConfigError(
            "`model.num_heads` must divide `model.hidden_dim`. Received: "
            f"hidden_dim={m.hidden_dim}, num_heads={m.num_heads}."
        )
    if m.hidden_dim % 2:
        raise ConfigError(
            f"`model.hidden_dim` must be even for the sinusoidal encoding; got {m.hidden_dim}."
        )
    for name, value in (("model.dropout", m.dropout),
                        ("model.attention_dropout", m.attention_dropout),
                        ("train.label_smoothing", cfg.train.label_smoothing)):
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"`{name}` must be in [0, 1); got {value}.")
    if cfg.data.token_budget < cfg.data.max_length:
        raise ConfigError(
            f"`data.token_budget` ({cfg.data.token_budget}) must be at least `data.max_length` "
            f"({cfg.data.max_length}) so that the longest pair fits in a batch."
        )
    bounds = cfg.data.bucket_boundaries
    if list(bounds) != sorted(set(bounds)) or (bounds and bounds[0] < 1):
        raise ConfigError(
            f"`data.bucket_boundaries` must be strictly increasing positive integers; got {bounds}."
        )
    if cfg.decode.n_best > cfg.decode.beam_size:
        raise ConfigError(
            f"`decode.n_best` ({cfg.decode.n_best}) cannot exceed `decode.beam_size` "
            f"({cfg.decode.beam_size})."
        )
    source_limit(cfg)


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
