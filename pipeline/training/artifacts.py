"""The run directory: its file names, and how to load what it holds (tokenizer, model, weights).

Every stage that reads or writes a run (training, evaluation, export, plots, the model card, TFX)
takes its paths from :class:`RunFiles` and builds its model with :func:`build_model`, so there is
one factory and one layout::

    <train.run_dir>/
        config.yaml              the resolved configuration
        checkpoints/             ckpt-<step:08d>.weights.h5, the last `train.keep_checkpoints`;
                                 ema-<step:08d>.weights.h5, the moving average of the weights
                                 at the last step (`train.ema_momentum`)
        best.weights.h5          the best dev BLEU seen during training
        final.weights.h5         the chosen weights (evaluate and export read these)
        averaging.json           last vs. average of the last N vs. best, scored on dev
        backup/                  BackupAndRestore state; re-running the same command resumes
        history.json, .csv       loss, learning rate, tokens/s, dev BLEU/chrF per logged step
        dev_eval_state.json      the dev-BLEU callback's best step and score
        tensorboard/             the same as TensorBoard scalars
        train_state.json         status (the run's end state: complete, time_budget, diverged,
                                 interrupted) and its summary
        train.lock               held by the training process (pid, host, start, command)
        eval/<split>.hyp.txt     hypotheses of `aiayn evaluate`, and eval/<split>.json
        summary.json, curves.png the closing summary of `aiayn run`, the training curves
        model_card.md            the model card

Weight files hold the model's weights only (no optimizer): :func:`load_model_weights` reads them
into a model from :func:`build_model`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import keras
import numpy as np

from aiayn.models.tokenizer import SubwordTokenizer
from aiayn.models.transformer import Transformer
from aiayn.pipeline.config import Config
from aiayn.pipeline.data.corpus import read_tsv_pairs, split_path
from aiayn.pipeline.data.vocab import output_ids, vocab_path
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_output

CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d+)\.weights\.h5$")
EMA_PATTERN = re.compile(r"^ema-(\d+)\.weights\.h5$")


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint of ``step`` (matches ``CHECKPOINT_PATTERN``)."""
    return f"ckpt-{step:08d}.weights.h5"


def ema_name(step: int) -> str:
    """The file name of the weights' moving average at ``step`` (matches ``EMA_PATTERN``)."""
    return f"ema-{step:08d}.weights.h5"


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """The paths of one run directory (see the module docstring for what each holds)."""

    root: Path

    @classmethod
    def of(cls, cfg: Config) -> RunFiles:
        return cls(Path(cfg.train.run_dir).expanduser())

    config = property(lambda self: self.root / "config.yaml")
    checkpoints = property(lambda self: self.root / "checkpoints")
    best = property(lambda self: self.root / "best.weights.h5")
    final = property(lambda self: self.root / "final.weights.h5")
    averaging = property(lambda self: self.root / "averaging.json")
    backup = property(lambda self: self.root / "backup")
    history_json = property(lambda self: self.root / "history.json")
    history_csv = property(lambda self: self.root / "history.csv")
    dev_eval_state = property(lambda self: self.root / "dev_eval_state.json")
    tensorboard = property(lambda self: self.root / "tensorboard")
    train_state = property(lambda self: self.root / "train_state.json")
    lock = property(lambda self: self.root / "train.lock")
    eval_dir = property(lambda self: self.root / "eval")
    summary = property(lambda self: self.root / "summary.json")
    curves = property(lambda self: self.root / "curves.png")
    model_card = property(lambda self: self.root / "model_card.md")

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / checkpoint_name(step)

    def ema(self, step: int) -> Path:
        """The moving average of the weights at ``step`` (``train.ema_momentum``)."""
        return self.checkpoints / ema_name(step)


def load_tokenizer(cfg: Config) -> SubwordTokenizer:
    """The run's :class:`SubwordTokenizer` (``<data_dir>/spm.model``).

    Raises:
      UserInputError: the vocabulary has not been built yet.
    """
    path = vocab_path(cfg)
    if not Path(path).exists():
        raise UserInputError(f"{path} not found: build the vocabulary first with `aiayn vocab` "
                             "(or `make train`).")
    return SubwordTokenizer.from_file(path)


def dummy_features(batch: int = 1, length: int = 4) -> dict[str, np.ndarray]:
    """A batch of model inputs that builds every weight (ids 4: an ordinary piece)."""
    ids = np.full((batch, length), 4, dtype="int32")
    mask = np.ones((batch, length), dtype=bool)
    return {"encoder_token_ids": ids, "encoder_padding_mask": mask,
            "decoder_token_ids": ids, "decoder_padding_mask": mask}


def build_model(cfg: Config, tokenizer: SubwordTokenizer, dtype: str | None = None) -> keras.Model:
    """THE model factory: the Transformer of ``cfg.model`` for ``tokenizer``, weights built.

    Args:
      cfg: the run configuration.
      tokenizer: the run's tokenizer (vocabulary size and pad id).
      (The ids it may produce come from ``data.output_vocabulary``:
      :func:`aiayn.pipeline.data.vocab.output_ids`.)
      dtype: a Keras dtype policy name; None = the global policy (training sets it). Evaluation
        and export pass ``"float32"``: the scores then describe exactly what is served, on any
        CPU (variables are float32 under every mixed policy, so weights load either way).
    """
    model = Transformer(vocabulary_size=tokenizer.vocabulary_size, pad_id=tokenizer.pad_id,
                        output_ids=output_ids(cfg), dtype=dtype, **dataclasses.asdict(cfg.model))
    model(dummy_features(), training=False)
    return model


def save_model_weights(model: keras.Model, path: str | os.PathLike) -> Path:
    """Writes the model's weights (no optimizer state) atomically to a ``.weights.h5`` file.

    The optimizer's slots would triple the file; evaluation, averaging and export need only the
    model. ``keras.src.saving.saving_lib`` is the one Keras entry point that can skip them (a
    private API: tests/test_keras_private_api.py fails, naming the Keras version, if it moves).
    """
    from keras.src.saving import saving_lib

    skip = [model.optimizer] if getattr(model, "optimizer", None) is not None else None
    with atomic_output(path) as tmp:
        saving_lib.save_weights_only(model, str(tmp), objects_to_skip=skip)
    return Path(path)


def load_model_weights(model: keras.Model, path: str | os.PathLike) -> None:
    """Loads a file written by :func:`save_model_weights` (optimizer state left untouched)."""
    from keras.src.saving import saving_lib

    skip = [model.optimizer] if getattr(model, "optimizer", None) is not None else None
    saving_lib.load_weights_only(model, str(path), objects_to_skip=skip)


def list_checkpoints(directory: str | os.PathLike,
                     pattern: re.Pattern = CHECKPOINT_PATTERN) -> list[tuple[int, Path]]:
    """``(step, path)`` of ``ckpt-<step>.weights.h5`` files (or of ``pattern``'s, whose group 1
    is the step: ``EMA_PATTERN``), oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in directory.iterdir()
                  if (m := pattern.match(p.name)))


def resolve_weights(cfg: Config, weights: str | os.PathLike | None) -> Path:
    """``weights`` if given, else the run's ``final.weights.h5``; it must exist.

    Raises:
      UserInputError: the file does not exist (names it and how to make it), or is not a
        ``.weights.h5`` file (Keras reads weights by the file's suffix; any other name, a
        directory included, would fail inside it without saying which file).
    """
    path = Path(weights).expanduser() if weights else RunFiles.of(cfg).final
    if not path.exists():
        raise UserInputError(
            f"Weights file {path} not found: train first (`aiayn train`) or pass --weights "
            "with a .weights.h5 file of this run.")
    if path.is_dir() or not path.name.endswith(".weights.h5"):
        kind = "a directory" if path.is_dir() else "not a .weights.h5 file"
        raise UserInputError(
            f"Weights file {path} is {kind}: pass --weights with a .weights.h5 file written by "
            f"`aiayn train` (the run's final.weights.h5, best.weights.h5 or a checkpoint in "
            f"{RunFiles.of(cfg).checkpoints}).")
    return path


def weights_load_error(path: str | os.PathLike, err: Exception,
                       run_config: Path | None = None) -> UserInputError:
    """One line for a weights file that :func:`load_model_weights` could not load: ``OSError``
    (not HDF5, truncated) or Keras's ``ValueError`` (the layers or shapes of another config)."""
    if isinstance(err, OSError):
        return UserInputError(f"Cannot read weights file {path}: {' '.join(str(err).split())}. "
                              "Pass a .weights.h5 file written by `aiayn train` for this run.")
    reason = (str(err).strip() or type(err).__name__).splitlines()[0]
    reason = re.split(r"\.\s+Example error message", reason)[0].rstrip(":.")
    where = f" ({run_config})" if run_config else ""
    return UserInputError(f"Weights file {path} does not fit the model of this config ({reason}). "
                          f"Use the preset and --set overrides the run was trained with{where}.")


def load_trained_model(cfg: Config, weights: str | os.PathLike | None = None,
                       dtype: str | None = "float32") -> tuple[keras.Model, SubwordTokenizer, Path]:
    """The run's tokenizer and model with its trained weights (float32 by default).

    Raises:
      UserInputError: the vocabulary or the weights file is missing, unreadable, or holds the
        weights of another model configuration.
    """
    path = resolve_weights(cfg, weights)
    tokenizer = load_tokenizer(cfg)
    model = build_model(cfg, tokenizer, dtype=dtype)
    try:
        load_model_weights(model, path)
    except (OSError, ValueError) as err:
        raise weights_load_error(path, err, RunFiles.of(cfg).config) from None
    return model, tokenizer, path


def read_split(cfg: Config, split: str) -> list[tuple[str, str]]:
    """The ``(source, target)`` pairs of a prepared split (``train``, ``dev`` or ``test``).

    Raises:
      UserInputError: the split has not been prepared (run `aiayn data`).
    """
    path = Path(split_path(cfg, split))
    if not path.exists():
        raise UserInputError(f"{path} not found: prepare the data first with `aiayn data`.")
    return read_tsv_pairs(path)


def dev_sample(cfg: Config, limit: int) -> list[tuple[str, str]]:
    """Up to ``limit`` dev pairs (0 = all), evenly spaced over the dev split; [] without one."""
    if not Path(split_path(cfg, "dev")).exists():
        return []
    pairs = read_split(cfg, "dev")
    if not limit or limit >= len(pairs):
        return pairs
    # Evenly spaced over the split (held-out books are contiguous: the first N would all come
    # from the first book).
    return [pairs[i * len(pairs) // limit] for i in range(limit)]
