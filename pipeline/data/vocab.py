"""The joint source+target SentencePiece vocabulary, trained on the training split.

One model for both languages (the paper's shared source-target vocabulary, §5.1), so the
embedding and pre-softmax weights can be tied (§3.4). Ids: pad=0, unk=1, bos=2, eos=3; code reads
them from the tokenizer (``aiayn.models.tokenizer.SubwordTokenizer``), never from here.

The normaliser is SentencePiece's ``nmt_nfkc`` (NFKC plus NMT-specific clean-up). It is stored in
the model proto and applied in-graph by the tensorflow-text op, so training and serving normalise
identically.

Example::

    cfg = load_config(["small"])
    path = train_vocab(cfg)  # data/spm.model
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import sentencepiece as spm

from aiayn.pipeline.config import Config
from aiayn.pipeline.data.corpus import sha256_file
from aiayn.pipeline.data.languages import default_character_coverage
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_write

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
NORMALIZATION_RULE = "nmt_nfkc"
MODEL_FILENAME = "spm.model"
OUTPUT_IDS_FILENAME = "output_ids.json"


def vocab_path(cfg: Config) -> Path:
    """Where the SentencePiece model lives: ``<cfg.data.data_dir>/spm.model``."""
    return Path(cfg.data.data_dir) / MODEL_FILENAME


def character_coverage(cfg: Config) -> float:
    """``data.character_coverage``, or for 0 the language pair's default: 0.9995 when a side
    is Chinese, Japanese or Korean, else 1.0 (:func:`~aiayn.pipeline.data.languages.
    default_character_coverage`)."""
    return cfg.data.character_coverage or default_character_coverage(cfg.data.source_lang,
                                                                     cfg.data.target_lang)


def _train_split(cfg: Config) -> Path:
    return Path(cfg.data.data_dir) / "train.tsv"


def _pairs(path: Path) -> Iterator[list[str]]:
    """Yields ``[source, target]`` for each non-empty line of `path` (a leading byte order mark
    dropped)."""
    with open(path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\n")
            if not line:
                continue
            sides = line.split("\t")
            if len(sides) != 2:
                raise UserInputError(
                    f"{path}:{number}: expected `source<TAB>target` (one tab), found "
                    f"{len(sides) - 1} tab(s). Rebuild the prepared data with `aiayn data`.")
            yield sides


def _sentences(path: Path) -> Iterator[str]:
    """Yields both sides of each `source<TAB>target` line of `path`."""
    for sides in _pairs(path):
        for side in sides:
            if side.strip():
                yield side


def train_vocab(cfg: Config) -> Path:
    """Trains the joint SentencePiece model on both sides of ``<data_dir>/train.tsv``.

    Settings come from ``cfg.data``: ``vocab_size`` (a soft limit: a corpus too small for it gets
    a smaller vocabulary rather than an error), ``vocab_model_type`` (unigram, bpe, char: one
    piece per character, word), ``character_coverage`` (0: :func:`character_coverage`) and
    ``vocab_sample_size`` (sentences sampled, seeded by ``seed``, from a large corpus). The file
    is written atomically (temporary file, then rename).

    Args:
      cfg: the run configuration.

    Returns:
      The path of the model, ``vocab_path(cfg)``.

    Raises:
      UserInputError: ``train.tsv`` is missing (run ``aiayn data`` / ``make data``), has a line
        without exactly one tab, is empty, or SentencePiece cannot build a vocabulary of the
        requested size and type from it (the message says which setting to change).
    """
    data = cfg.data
    train_path = _train_split(cfg)
    if not train_path.is_file():
        raise UserInputError(
            f"Training split not found: {train_path}. Prepare the data first with "
            f"`aiayn data --preset <name>` (or `make data`); it writes train/dev/test.tsv to "
            f"`data.data_dir` ({data.data_dir}).")
    # Fail early on an empty split (SentencePiece's own message is obscure).
    if next(_sentences(train_path), None) is None:
        raise UserInputError(f"{train_path} has no sentences; rebuild it with `aiayn data`.")

    writer = io.BytesIO()
    spm.set_random_generator_seed(int(data.seed))
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(train_path),
            model_writer=writer,
            model_type=data.vocab_model_type,
            vocab_size=data.vocab_size,
            # A soft limit: fewer pieces when the corpus cannot supply `vocab_size` of them.
            hard_vocab_limit=False,
            character_coverage=character_coverage(cfg),
            normalization_rule_name=NORMALIZATION_RULE,
            input_sentence_size=data.vocab_sample_size,
            shuffle_input_sentence=True,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            num_threads=max(1, min(os.cpu_count() or 1, 16)),
            minloglevel=2,
        )
    except UserInputError:
        raise
    except RuntimeError as err:
        needed = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(err))
        if needed:
            fix = (f"raise `data.vocab_size` to at least {needed.group(2)} (the corpus has "
                   "that many characters plus the 4 special pieces), or lower "
                   "`data.character_coverage` (e.g. --set data.character_coverage=0.9995)")
        else:
            fix = ("the corpus is probably too small for this size or model type; lower "
                   f"`data.vocab_size` (e.g. --set data.vocab_size={max(8, data.vocab_size // 4)}) "
                   "or use `data.vocab_model_type=unigram`")
        raise UserInputError(
            f"SentencePiece could not train a {data.vocab_model_type} vocabulary of size "
            f"{data.vocab_size} on {train_path}: {fix}. (SentencePiece said: {err})") from err

    out = vocab_path(cfg)
    return atomic_write(out, writer.getvalue())


def output_ids(cfg: Config) -> list[int] | None:
    """The token ids the decoder may produce (``Transformer(output_ids=...)``), by
    ``data.output_vocabulary``.

    ``"joint"``: None, the whole shared vocabulary (the paper). ``"target"``: the four special
    ids and every piece of the target side of ``<data_dir>/train.tsv``, segmented as the
    featuriser segments it (SentencePiece's best segmentation), ascending: the only labels
    training ever sees. With a joint vocabulary about a third of the pieces occur only on the
    source side (en->es Bible: 5,213 of 8,000 pieces are targets), and the training projection,
    softmax and loss then cover the output pieces only.

    The ids are kept in ``<data_dir>/output_ids.json`` with the SHA-256 of ``spm.model`` and of
    ``train.tsv`` they were read from, and read again (and the file rewritten, atomically) when
    either has changed. Without ``train.tsv`` the kept ids serve while ``spm.model`` matches.

    Raises:
      UserInputError: no ``spm.model``, or no ``train.tsv`` and no matching kept ids.
    """
    if cfg.data.output_vocabulary == "joint":
        return None
    model, train = vocab_path(cfg), _train_split(cfg)
    kept_path = Path(cfg.data.data_dir) / OUTPUT_IDS_FILENAME
    if not model.is_file():
        raise UserInputError(f"{model} not found: build the vocabulary first with `aiayn vocab` "
                             "(or `make train`).")
    spm_hash = sha256_file(model)
    train_hash = sha256_file(train) if train.is_file() else None
    kept = json.loads(kept_path.read_text(encoding="utf-8")) if kept_path.is_file() else {}
    if kept.get("spm_sha256") == spm_hash and train_hash in (None, kept.get("train_sha256")):
        return [int(i) for i in kept["ids"]]
    if train_hash is None:
        raise UserInputError(
            f"`data.output_vocabulary=target` reads the target pieces of {train}, which is "
            f"missing (and {kept_path} does not match {model}). Rebuild the data with `aiayn "
            "data` (or `make train`), or set `data.output_vocabulary=joint`.")
    processor = spm.SentencePieceProcessor(model_file=str(model))
    ids = {PAD_ID, UNK_ID, BOS_ID, EOS_ID}
    for _, target in _pairs(train):
        ids.update(processor.encode(target))
    ids = sorted(ids)
    atomic_write(kept_path, json.dumps({
        "spm_sha256": spm_hash, "train_sha256": train_hash,
        "vocabulary_size": processor.get_piece_size(), "output_pieces": len(ids),
        "ids": ids}) + "\n")
    return ids
