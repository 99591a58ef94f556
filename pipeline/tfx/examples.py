"""Corpus -> TFX ExampleGen input: ``tf.Example`` records with ``source`` / ``target`` bytes.

Any corpus the project reads (``data.corpus``: the default Bible corpus, TSV, aligned text
files, TFRecord, TFDS) is first prepared as usual (:func:`aiayn.pipeline.data.corpus.prepare_data`:
normalised, validated, split), then its splits are written as ExampleGen input::

    <out_dir>/train/data.tfrecord.gz     the training split
    <out_dir>/eval/data.tfrecord.gz      the dev split (TFX calls it "eval")

or, with ``fmt="csv"``, ``<out_dir>/{train,eval}/data.csv`` with a ``source,target`` header for
``CsvExampleGen``. :data:`INPUT_SPLITS` holds the glob of each split relative to ``out_dir``, as
ExampleGen's ``input_config`` wants them, so the splits TFX sees are exactly the project's.

Example::

    cfg = load_config(["tiny"], ["data.corpus=my.tsv", "data.heldout_size=10"])
    out = write_example_gen_input(cfg)          # <data_dir>/tfx_examples
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiayn.pipeline.config import Config
from aiayn.pipeline.data import corpus
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_output

SOURCE_KEY, TARGET_KEY = "source", "target"
# ExampleGen split name -> the project's prepared split it comes from.
SPLIT_SOURCES = {"train": "train", "eval": "dev"}
FORMATS = ("tfrecord", "csv")
_FILE_NAMES = {"tfrecord": "data.tfrecord.gz", "csv": "data.csv"}
INPUT_SPLITS = {split: f"{split}/*" for split in SPLIT_SOURCES}


def default_examples_dir(cfg: Config) -> Path:
    """Where :func:`write_example_gen_input` writes by default: ``<data_dir>/tfx_examples``."""
    return Path(cfg.data.data_dir) / "tfx_examples"


def make_example(source: str, target: str) -> Any:
    """One ``tf.train.Example`` with UTF-8 bytes features ``source`` and ``target``."""
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature={
        SOURCE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[source.encode()])),
        TARGET_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[target.encode()])),
    }))


def write_tfrecord(path: str | os.PathLike, pairs: Iterable[tuple[str, str]]) -> int:
    """Writes pairs as GZIP TFRecord ``tf.Example``s (what ExampleGen itself writes); a count."""
    import tensorflow as tf

    n = 0
    with atomic_output(path) as tmp, tf.io.TFRecordWriter(str(tmp), options="GZIP") as writer:
        for source, target in pairs:
            writer.write(make_example(source, target).SerializeToString())
            n += 1
    return n


def write_csv(path: str | os.PathLike, pairs: Iterable[tuple[str, str]]) -> int:
    """Writes pairs as a two-column CSV with a ``source,target`` header (CsvExampleGen)."""
    n = 0
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)  # quoted: a side such as "7" stays text
        writer.writerow([SOURCE_KEY, TARGET_KEY])
        for source, target in pairs:
            writer.writerow([source, target])
            n += 1
    return n


def write_example_gen_input(cfg: Config, out_dir: str | os.PathLike | None = None,
                            fmt: str = "tfrecord") -> dict[str, Any]:
    """Prepares ``cfg``'s corpus and writes its train and dev splits as ExampleGen input.

    Args:
      cfg: the run configuration (``data`` section: which corpus, where prepared data goes).
      out_dir: output directory; default :func:`default_examples_dir`.
      fmt: ``tfrecord`` (ImportExampleGen) or ``csv`` (CsvExampleGen).

    Returns:
      ``{"examples_dir", "format", "splits": {split: {"path", "pairs"}}, "input_splits"}``.

    Raises:
      UserInputError: an unknown format, or a corpus error from ``prepare_data``.
    """
    if fmt not in FORMATS:
        raise UserInputError(f"Unknown ExampleGen input format {fmt!r}; use one of "
                             f"{', '.join(FORMATS)}.")
    out = Path(out_dir) if out_dir else default_examples_dir(cfg)
    corpus.prepare_data(cfg)
    writer = write_tfrecord if fmt == "tfrecord" else write_csv
    splits = {}
    for split, prepared in SPLIT_SOURCES.items():
        # One format per directory: a stale file of the other format would be read as well.
        for other in _FILE_NAMES.values():
            (out / split / other).unlink(missing_ok=True)
        path = out / split / _FILE_NAMES[fmt]
        pairs = corpus.read_tsv_pairs(corpus.split_path(cfg, prepared))
        splits[split] = {"path": str(path), "pairs": writer(path, pairs), "from": prepared}
    return {"examples_dir": str(out), "format": fmt, "splits": splits,
            "input_splits": dict(INPUT_SPLITS)}
