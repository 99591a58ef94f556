"""Parallel corpora in, prepared ``{train,dev,test}.tsv`` and a data report out.

The contract (docs/CONTRACTS.md, "Prepared data"): :func:`prepare_data` writes
``<data_dir>/{train,dev,test}.tsv`` (UTF-8, ``source<TAB>target`` per line, whitespace
normalised) and ``<data_dir>/data_report.json``; :func:`split_path` and :func:`read_tsv_pairs`
are how the later stages find and read them.

Corpora (``data.corpus``, format from ``data.format`` or guessed):

- ``bible``: the default English->Spanish corpus built from Debian's SWORD modules
  (:mod:`aiayn.pipeline.data.bible`), split by whole books.
- TSV: ``source<TAB>target`` per line.
- Line-aligned text files: a prefix (``data/train`` -> ``data/train.en`` + ``data/train.es``,
  from ``data.source_lang`` / ``data.target_lang``) or two paths joined by a comma.
- TFRecord files of ``tf.Example`` with ``source`` / ``target`` bytes features, GZIP or not
  (detected), as TFX ExampleGen writes them: a file, a glob or a directory.
- ``tfds:<name>[@split]``: a TFDS translation dataset already prepared on disk (never downloaded).

Bad input (lines without exactly one tab, invalid UTF-8, empty sides, absurd length ratios)
stops with a :class:`CorpusError` that names the file, line (or record), field and the fix; with
``data.on_error=skip`` the pair is dropped and counted by reason in the report instead. Files of
different line counts are always an error.

Example::

    cfg = load_config(["tiny"], ["data.corpus=my.tsv", "data.heldout_size=100"])
    report = prepare_data(cfg)
    pairs = read_tsv_pairs(split_path(cfg, "train"))
"""

from __future__ import annotations

import dataclasses
import glob as globlib
import hashlib
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_output

SPLITS = ("train", "dev", "test")
REPORT_NAME = "data_report.json"
ALIGNMENT_REPORT_NAME = "alignment_report.json"
# Bump when the preparation logic changes, so that stale outputs are rebuilt.
PREPARE_VERSION = 1
# A pair is absurd when its longer side has more than `max_length_ratio` times the characters of
# the shorter one; pairs whose longer side is shorter than this are never flagged ("Amen."/"Amén.").
MIN_LENGTH_FOR_RATIO = 16

Pair = tuple[str, str]


class CorpusError(UserInputError):
    """A corpus file is missing or malformed; the message names file, line, field and fix."""


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------

def normalize_side(text: str) -> str:
    """Collapses whitespace (tabs and newlines included) to single spaces and strips."""
    return " ".join(text.split())


@dataclasses.dataclass
class Drops:
    """Counts of dropped pairs by reason (only used with ``on_error='skip'``)."""

    on_error: str = "error"
    counts: Counter = dataclasses.field(default_factory=Counter)
    examples: dict = dataclasses.field(default_factory=dict)

    def bad(self, reason: str, message: str) -> None:
        """Raises ``message`` in error mode; counts the drop (keeping one example) in skip mode."""
        if self.on_error != "skip":
            raise CorpusError(message)
        self.counts[reason] += 1
        self.examples.setdefault(reason, message)


_SKIP_HINT = "or set data.on_error=skip to drop and count such pairs"


def check_pair(source: str, target: str, where: str, drops: Drops,
               max_length_ratio: float) -> Pair | None:
    """Normalises a pair and applies the empty-side and length-ratio checks.

    Returns the normalised pair, or None when it was dropped (skip mode).

    Raises:
      CorpusError: in error mode, for an empty side or an absurd length ratio.
    """
    source, target = normalize_side(source), normalize_side(target)
    for side, text in (("source", source), ("target", target)):
        if not text:
            drops.bad("empty_side",
                      f"{where}: the {side} side is empty. Remove the line or fill it in, "
                      f"{_SKIP_HINT}.")
            return None
    longer, shorter = max(len(source), len(target)), min(len(source), len(target))
    if max_length_ratio > 0 and longer >= MIN_LENGTH_FOR_RATIO and (
            longer > max_length_ratio * shorter):
        drops.bad("length_ratio",
                  f"{where}: absurd length ratio: source has {len(source)} characters, target "
                  f"{len(target)} (ratio {longer / shorter:.1f} > data.max_length_ratio="
                  f"{max_length_ratio:g}); the sides are probably misaligned. Fix the pair, raise "
                  f"data.max_length_ratio, {_SKIP_HINT}.")
        return None
    return source, target


def _decode(raw: bytes, where: str, field: str, drops: Drops, line_offset: int = -1
            ) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        at = f"byte {err.start} of the {field}" + (
            f" (byte offset {line_offset + err.start} in the file)" if line_offset >= 0 else "")
        drops.bad("invalid_utf8",
                  f"{where}: invalid UTF-8 in the {field} at {at}: {raw[err.start:err.start + 4]!r}"
                  f". Re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), "
                  f"{_SKIP_HINT}.")
        return None


def _lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(1-based line number, byte offset, raw line without the newline) of a file."""
    data = path.read_bytes()
    offset = 0
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line; it does not start another
    for number, raw in enumerate(lines, start=1):
        yield number, offset, raw[:-1] if raw.endswith(b"\r") else raw
        offset += len(raw) + 1


def _require_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise CorpusError(f"{what} {str(path)!r} does not exist (working directory: {os.getcwd()}). "
                          "Check data.corpus / data.dev_corpus / data.test_corpus.")


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------

def read_tsv(path: str | os.PathLike, drops: Drops | None = None,
             max_length_ratio: float = 0.0) -> list[Pair]:
    """Reads ``source<TAB>target`` lines.

    Raises:
      CorpusError: missing file; in error mode also a line without exactly one tab, invalid
        UTF-8, an empty side or an absurd length ratio (file, line and fix in the message).
    """
    path = Path(path)
    _require_file(path, "TSV corpus")
    drops = drops or Drops()
    pairs = []
    for number, offset, raw in _lines(path):
        where = f"{path}:{number}"
        tabs = raw.count(b"\t")
        if tabs != 1:
            drops.bad("bad_tsv_line",
                      f"{where}: expected exactly one tab (source<TAB>target), found {tabs}. "
                      "Replace tabs inside a side by spaces, remove blank lines, "
                      f"{_SKIP_HINT}.")
            continue
        text = _decode(raw, where, "line", drops, offset)
        if text is None:
            continue
        source, target = text.split("\t")
        pair = check_pair(source, target, where, drops, max_length_ratio)
        if pair:
            pairs.append(pair)
    return pairs


def read_tsv_pairs(path: str | os.PathLike) -> list[Pair]:
    """Reads a prepared split (written by :func:`prepare_data`): ``[(source, target), ...]``."""
    return read_tsv(path)


def read_text_pair(source_path: str | os.PathLike, target_path: str | os.PathLike,
                   drops: Drops | None = None, max_length_ratio: float = 0.0) -> list[Pair]:
    """Reads two line-aligned files (line n of one translates line n of the other).

    Raises:
      CorpusError: missing file or different line counts (always); in error mode also invalid
        UTF-8, an empty side or an absurd length ratio.
    """
    source_path, target_path = Path(source_path), Path(target_path)
    _require_file(source_path, "Source file")
    _require_file(target_path, "Target file")
    drops = drops or Drops()
    src, tgt = list(_lines(source_path)), list(_lines(target_path))
    if len(src) != len(tgt):
        raise CorpusError(
            f"Line-aligned files differ in length: {source_path} has {len(src)} lines, "
            f"{target_path} has {len(tgt)}. Line n of one must translate line n of the other; "
            "re-export them together (and check for stray newlines inside a sentence).")
    pairs = []
    for (number, off_s, raw_s), (_, off_t, raw_t) in zip(src, tgt):
        s = _decode(raw_s, f"{source_path}:{number}", "line", drops, off_s)
        if s is None:
            continue
        t = _decode(raw_t, f"{target_path}:{number}", "line", drops, off_t)
        if t is None:
            continue
        pair = check_pair(s, t, f"{source_path}:{number} / {target_path}:{number}", drops,
                          max_length_ratio)
        if pair:
            pairs.append(pair)
    return pairs


def _expand_files(pattern: str) -> list[Path]:
    path = Path(pattern)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    else:
        files = sorted(Path(p) for p in globlib.glob(pattern) if Path(p).is_file())
    return files


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def read_tfrecord(pattern: str, drops: Drops | None = None, max_length_ratio: float = 0.0,
                  source_key: str = "source", target_key: str = "target") -> list[Pair]:
    """Reads ``tf.Example`` records with ``source`` / ``target`` bytes features.

    ``pattern`` is a file, a glob or a directory (TFX ExampleGen output, e.g.
    ``.../Split-train``); each file's GZIP compression is detected from its first bytes.

    Raises:
      CorpusError: no files, a corrupt file, a record without the features (in any mode); in
        error mode also invalid UTF-8, an empty side or an absurd length ratio.
    """
    files = _expand_files(pattern)
    if not files:
        raise CorpusError(f"No TFRecord files match {pattern!r} (working directory: "
                          f"{os.getcwd()}). Give a file, a glob or a directory.")
    import tensorflow as tf  # lazily: the text readers stay light

    drops = drops or Drops()
    pairs = []
    for path in files:
        compression = "GZIP" if _is_gzip(path) else ""
        dataset = tf.data.TFRecordDataset(str(path), compression_type=compression)
        try:
            for number, record in enumerate(dataset.as_numpy_iterator(), start=1):
                where = f"{path}: record {number}"
                try:
                    example = tf.train.Example.FromString(record)
                except Exception as err:  # protobuf's DecodeError
                    raise CorpusError(f"{where}: not a tf.Example ({err}). Write tf.train.Example "
                                      "records with bytes features "
                                      f"{source_key!r} and {target_key!r}.") from None
                sides = []
                for key in (source_key, target_key):
                    feature = example.features.feature.get(key)
                    if feature is None or not feature.bytes_list.value:
                        present = sorted(example.features.feature.keys())
                        raise CorpusError(
                            f"{where}: no bytes feature {key!r} (features present: {present}). "
                            f"Each tf.Example needs bytes features {source_key!r} and "
                            f"{target_key!r}, as TFX ExampleGen writes for a two-column CSV.")
                    sides.append(_decode(feature.bytes_list.value[0], where,
                                         f"{key!r} feature", drops))
                if sides[0] is None or sides[1] is None:
                    continue
                pair = check_pair(sides[0], sides[1], where, drops, max_length_ratio)
                if pair:
                    pairs.append(pair)
        except tf.errors.DataLossError as err:
            raise CorpusError(f"{path}: corrupt TFRecord file ({err.message.splitlines()[0]}). "
                              "Re-write it, or remove it from the pattern.") from None
    return pairs


def read_tfds(spec: str, source_lang: str, target_lang: str, drops: Drops | None = None,
              max_length_ratio: float = 0.0, default_split: str = "train") -> list[Pair]:
    """Reads ``tfds:<name>[@split]`` from data already prepared on disk (never downloads).

    The data directory is ``$TFDS_DATA_DIR`` or TFDS's default (``~/tensorflow_datasets``).
    Features are the language codes (``data.source_lang`` / ``data.target_lang``), as in TFDS's
    translation datasets.

    Raises:
      CorpusError: tensorflow_datasets missing, dataset not prepared, unknown split or language.
    """
    name = spec[len("tfds:"):] if spec.startswith("tfds:") else spec
    name, _, split = name.partition("@")
    split = split or default_split
    try:
        import tensorflow_datasets as tfds  # optional dependency
    except ImportError:
        raise CorpusError(
            f"data.corpus={spec!r} needs tensorflow_datasets, which is not installed: "
            "`pip install tensorflow-datasets`, then prepare the dataset with "
            f"`tfds build {name}` (this project never downloads data itself).") from None
    data_dir = os.environ.get("TFDS_DATA_DIR")
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as err:
        raise CorpusError(f"TFDS dataset {name!r}: {err}. Check the name "
                          "(e.g. tfds:wmt14_translate/de-en).") from None
    is_prepared = getattr(builder, "is_prepared", None)
    prepared = is_prepared() if callable(is_prepared) else (
        Path(builder.data_dir) / "dataset_info.json").exists()
    if not prepared:
        raise CorpusError(
            f"TFDS dataset {name!r} is not prepared in {builder.data_dir}. Prepare it first "
            f"(`tfds build {name}`, or download_and_prepare() on a machine with network), or set "
            "TFDS_DATA_DIR to where it is; this project never downloads data itself.")
    if split not in builder.info.splits:
        raise CorpusError(f"TFDS dataset {name!r} has no split {split!r}; splits: "
                          f"{sorted(builder.info.splits.keys())}. Use tfds:{name}@<split>.")
    keys = list(builder.info.features.keys())
    for lang in (source_lang, target_lang):
        if lang not in keys:
            raise CorpusError(f"TFDS dataset {name!r} has no feature {lang!r} (features: {keys}). "
                              "Set data.source_lang / data.target_lang to two of them.")
    drops = drops or Drops()
    pairs = []
    for number, ex in enumerate(tfds.as_numpy(builder.as_dataset(split=split)), start=1):
        where = f"tfds:{name}@{split}: example {number}"
        s = _decode(ex[source_lang], where, f"{source_lang!r} feature", drops)
        t = _decode(ex[target_lang], where, f"{target_lang!r} feature", drops)
        if s is None or t is None:
            continue
        pair = check_pair(s, t, where, drops, max_length_ratio)
        if pair:
            pairs.append(pair)
    return pairs


def detect_format(spec: str, source_lang: str = "en", target_lang: str = "es") -> str:
    """Guesses ``tsv``, ``text``, ``tfrecord`` or ``tfds`` from a corpus spec."""
    if spec.startswith("tfds:"):
        return "tfds"
    if "," in spec:
        return "text"
    path = Path(spec)
    if path.is_dir() or any(ch in spec for ch in "*?["):
        return "tfrecord"
    if path.is_file():
        name = path.name.lower()
        if "tfrecord" in name or name.endswith((".gz", ".tfr")):
            return "tfrecord"
        return "tsv"
    if Path(f"{spec}.{source_lang}").is_file() or Path(f"{spec}.{target_lang}").is_file():
        return "text"
    raise CorpusError(
        f"Corpus {spec!r} not found (working directory: {os.getcwd()}): no such file, directory "
        f"or glob, and no {spec}.{source_lang} / {spec}.{target_lang}. Give a TSV file, a prefix "
        "of line-aligned files, two paths joined by a comma, TFRecord files, tfds:<name>, or "
        "'bible'.")


def _text_paths(spec: str, source_lang: str, target_lang: str) -> tuple[str, str]:
    if "," in spec:
        parts = [p.strip() for p in spec.split(",")]
        if len(parts) != 2 or not all(parts):
            raise CorpusError(f"Corpus {spec!r}: give exactly two paths joined by a comma "
                              "(source,target).")
        return parts[0], parts[1]
    return f"{spec}.{source_lang}", f"{spec}.{target_lang}"


def read_corpus(spec: str, fmt: str = "auto", *, source_lang: str = "en",
                target_lang: str = "es", drops: Drops | None = None,
                max_length_ratio: float = 0.0, tfds_split: str = "train") -> list[Pair]:
    """Reads a user corpus in any supported format (see the module docstring)."""
    drops = drops or Drops()
    fmt = detect_format(spec, source_lang, target_lang) if fmt == "auto" else fmt
    if fmt == "tsv":
        return read_tsv(spec, drops, max_length_ratio)
    if fmt == "text":
        return read_text_pair(*_text_paths(spec, source_lang, target_lang), drops=drops,
                              max_length_ratio=max_length_ratio)
    if fmt == "tfrecord":
        return read_tfrecord(spec, drops, max_length_ratio)
    if fmt == "tfds":
        return read_tfds(spec, source_lang, target_lang, drops, max_length_ratio, tfds_split)
    raise CorpusError(f"Unknown data.format {fmt!r}; use auto, tsv, text, tfrecord or tfds.")


# --------------------------------------------------------------------------------------------
# Preparing the splits
# --------------------------------------------------------------------------------------------

def split_path(cfg, split: str) -> Path:
    """``<data_dir>/<split>.tsv`` for split in train/dev/test."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}; got {split!r}.")
    return Path(cfg.data.data_dir) / f"{split}.tsv"


def _atomic_write(path: Path, write) -> None:
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        write(f)


def write_tsv(path: Path, pairs: Iterable[Pair]) -> None:
    """Writes pairs as ``source<TAB>target`` lines, atomically (temporary file + rename)."""
    def write(f):
        for s, t in pairs:
            f.write(f"{normalize_side(s)}\t{normalize_side(t)}\n")
    _atomic_write(path, write)


def write_json(path: Path, data: Any) -> None:
    """Writes JSON atomically."""
    _atomic_write(path, lambda f: (json.dump(data, f, indent=2, ensure_ascii=False),
                                   f.write("\n")))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _input_fingerprint(spec: str) -> Any:
    """Size and mtime of the files a spec names (so an edited corpus triggers a rebuild)."""
    if not spec or spec == "bible" or spec.startswith("tfds:"):
        return spec
    paths: list[Path] = []
    for part in spec.split(","):
        part = part.strip()
        paths += _expand_files(part) or sorted(Path(p) for p in globlib.glob(f"{part}.*"))
    return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths if p.is_file()]


def _stamp(cfg) -> str:
    d = cfg.data
    inputs = {
        "version": PREPARE_VERSION,
        "config": {k: getattr(d, k) for k in (
            "corpus", "format", "dev_corpus", "test_corpus", "heldout_size", "source_lang",
            "target_lang", "on_error", "max_length_ratio", "seed")},
        "files": [_input_fingerprint(s) for s in (d.corpus, d.dev_corpus, d.test_corpus)],
    }
    if d.corpus == "bible":
        from aiayn.pipeline.data import bible
        inputs["packages"] = bible.package_versions()
    blob = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _up_to_date(cfg, stamp: str) -> dict | None:
    report_path = Path(cfg.data.data_dir) / REPORT_NAME
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if report.get("stamp") != stamp:
        return None
    for split in SPLITS:
        path = split_path(cfg, split)
        info = report.get("splits", {}).get(split, {})
        if not path.is_file() or sha256_file(path) != info.get("sha256"):
            return None
    return report


def _heldout(pairs: list[Pair], size: int, seed: int, spec: str
             ) -> tuple[list[Pair], list[Pair], list[Pair]]:
    """Draws disjoint dev and test sets of ``size`` pairs each (seeded); the rest is train."""
    import numpy as np

    if size < 1 or len(pairs) < 2 * size + 1:
        raise CorpusError(
            f"Corpus {spec!r} has {len(pairs)} usable pairs; holding out data.heldout_size={size} "
            f"each for dev and test needs at least {2 * size + 1}. Lower data.heldout_size, or "
            "give data.dev_corpus and data.test_corpus.")
    order = np.random.default_rng(seed).permutation(len(pairs))
    dev_idx, test_idx = set(order[:size].tolist()), set(order[size:2 * size].tolist())
    dev = [pairs[i] for i in sorted(dev_idx)]
    test = [pairs[i] for i in sorted(test_idx)]
    train = [p for i, p in enumerate(pairs) if i not in dev_idx and i not in test_idx]
    return train, dev, test


def _user_splits(cfg) -> tuple[dict[str, list[Pair]], dict[str, Drops], dict]:
    d = cfg.data
    drops = {s: Drops(d.on_error) for s in SPLITS}
    kw = dict(source_lang=d.source_lang, target_lang=d.target_lang,
              max_length_ratio=d.max_length_ratio)
    corpus_drops = Drops(d.on_error)
    pairs = read_corpus(d.corpus, d.format, drops=corpus_drops, **kw)
    source = {"corpus": d.corpus, "format": d.format if d.format != "auto" else
              detect_format(d.corpus, d.source_lang, d.target_lang)}
    if d.dev_corpus or d.test_corpus:
        if not (d.dev_corpus and d.test_corpus):
            raise CorpusError("Give both data.dev_corpus and data.test_corpus, or neither (then "
                              f"data.heldout_size={d.heldout_size} pairs each are held out).")
        splits = {"train": pairs}
        drops["train"] = corpus_drops
        for split, spec in (("dev", d.dev_corpus), ("test", d.test_corpus)):
            fmt = d.format if d.format != "auto" else "auto"
            splits[split] = read_corpus(spec, fmt, drops=drops[split],
                                        tfds_split="validation" if split == "dev" else "test",
                                        **kw)
            source[f"{split}_corpus"] = spec
        for split in ("dev", "test"):
            if not splits[split]:
                raise CorpusError(f"data.{split}_corpus {source[f'{split}_corpus']!r} has no "
                                  "usable pairs.")
    else:
        train, dev, test = _heldout(pairs, d.heldout_size, d.seed, d.corpus)
        splits = {"train": train, "dev": dev, "test": test}
        drops["train"] = corpus_drops  # drops happen before the held-out draw
        source["heldout"] = f"{d.heldout_size} pairs each for dev and test, drawn with seed {d.seed}"
    if not splits["train"]:
        raise CorpusError(f"Corpus {d.corpus!r} has no usable training pairs.")
    return splits, drops, source


def _bible_splits(cfg) -> tuple[dict[str, list[Pair]], dict[str, Drops], dict, dict]:
    from aiayn.pipeline.data import bible

    corpus = bible.build_bible_corpus(seed=cfg.data.seed)
    drops = {s: Drops("skip") for s in SPLITS}  # our own data: checks drop and count
    splits = {}
    for split in SPLITS:
        kept = []
        for n, (s, t) in enumerate(corpus.splits[split], start=1):
            pair = check_pair(s, t, f"bible {split} pair {n}", drops[split],
                              cfg.data.max_length_ratio)
            if pair:
                kept.append(pair)
        splits[split] = kept
    alignment = {k: v for k, v in corpus.alignment_report.items() if k != "books"}
    source = {
        "corpus": "bible",
        "description": "World English Bible (engWEB2015eb) -> Reina-Valera 1909 (spaRV1909eb), "
                       "verse pairs read with mod2imp, split by whole books",
        "source_module": bible.SOURCE_MODULE,
        "target_module": bible.TARGET_MODULE,
        "packages": corpus.packages,
        "books": {"dev": list(bible.DEV_BOOKS), "test": list(bible.TEST_BOOKS),
                  "train": "every other book both modules have"},
        "cleanup": corpus.cleanup,
        "alignment": alignment,
    }
    return splits, drops, source, corpus.alignment_report


def prepare_data(cfg) -> dict:
    """Builds ``<data_dir>/{train,dev,test}.tsv`` and ``data_report.json``; returns the report.

    Skips the work when the outputs exist, their checksums match the report and the inputs and
    data settings are unchanged (the report's ``stamp``).

    Raises:
      CorpusError: bad or missing input (see the module docstring), or mod2imp / the SWORD
        modules missing for ``data.corpus=bible`` (with the apt command).
    """
    start = time.monotonic()
    stamp = _stamp(cfg)
    existing = _up_to_date(cfg, stamp)
    if existing is not None:
        existing["reused"] = True
        return existing
    alignment_report = None
    if cfg.data.corpus == "bible":
        splits, drops, source, alignment_report = _bible_splits(cfg)
    else:
        splits, drops, source = _user_splits(cfg)
    data_dir = Path(cfg.data.data_dir)
    report_splits = {}
    dropped_total: Counter = Counter()
    for split in SPLITS:
        path = split_path(cfg, split)
        write_tsv(path, splits[split])
        dropped_total.update(drops[split].counts)
        report_splits[split] = {
            "path": str(path),
            "pairs": len(splits[split]),
            "sha256": sha256_file(path),
            "dropped": dict(sorted(drops[split].counts.items())),
            "drop_examples": drops[split].examples,
        }
    if alignment_report is not None:
        write_json(data_dir / ALIGNMENT_REPORT_NAME, alignment_report)
    report = {
        "stamp": stamp,
        "source": source,
        "on_error": cfg.data.on_error if cfg.data.corpus != "bible" else "skip",
        "max_length_ratio": cfg.data.max_length_ratio,
        "kept": sum(len(p) for p in splits.values()),
        "dropped": dict(sorted(dropped_total.items())),
        "splits": report_splits,
        "elapsed_s": round(time.monotonic() - start, 1),
        "reused": False,
    }
    if alignment_report is not None:
        report["alignment_report"] = str(data_dir / ALIGNMENT_REPORT_NAME)
    write_json(data_dir / REPORT_NAME, report)
    return report
