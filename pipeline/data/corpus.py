"""Parallel corpora in, prepared ``{train,dev,test}.tsv`` and a data report out.

The contract (docs/CONTRACTS.md, "Prepared data"): :func:`prepare_data` writes
``<data_dir>/{train,dev,test}.tsv`` (UTF-8, ``source<TAB>target`` per line, whitespace
normalised) and ``<data_dir>/data_report.json``; :func:`split_path` and :func:`read_tsv_pairs`
are how the later stages find and read them, :func:`write_tsv` how other producers write them.

Corpora (``data.corpus``):

- ``bible``: the default English->Spanish corpus built from Debian's SWORD modules
  (:mod:`aiayn.pipeline.data.bible`), split by whole books.
- anything else: a user corpus in one of the formats of :mod:`aiayn.pipeline.data.readers` (TSV,
  line-aligned text files, TFRecord, ``tfds:<name>``), with dev and test from
  ``data.dev_corpus`` / ``data.test_corpus`` or drawn from it (``data.heldout_size`` each).

Bad input stops with a :class:`~aiayn.pipeline.data.readers.CorpusError` that names the file,
line (or record), field and the fix; with ``data.on_error=skip`` the pair is dropped and counted
by reason in the report instead. Files of different line counts are always an error.

Example::

    cfg = load_config(["tiny"], ["data.corpus=my.tsv", "data.heldout_size=100"])
    report = prepare_data(cfg)
    pairs = read_tsv_pairs(split_path(cfg, "train"))
"""

from __future__ import annotations

import glob as globlib
import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiayn.pipeline.data.languages import LENGTH_UNIT
from aiayn.pipeline.data.readers import (
    CorpusError,
    Drops,
    Pair,
    check_pair,
    detect_format,
    expand_files,
    normalize_side,
    read_corpus,
    read_tsv,
)
from aiayn.pipeline.fileio import atomic_output, atomic_write

SPLITS = ("train", "dev", "test")
REPORT_NAME = "data_report.json"
ALIGNMENT_REPORT_NAME = "alignment_report.json"
# Bump when the preparation logic changes, so that stale outputs are rebuilt.
# 2: the length-ratio check counts characters weighted by script (data/languages.py).
PREPARE_VERSION = 2


def split_path(cfg, split: str) -> Path:
    """``<data_dir>/<split>.tsv`` for split in train/dev/test."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}; got {split!r}.")
    return Path(cfg.data.data_dir) / f"{split}.tsv"


def read_tsv_pairs(path: str | os.PathLike) -> list[Pair]:
    """Reads a prepared split (written by :func:`prepare_data`): ``[(source, target), ...]``."""
    return read_tsv(path)


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


def update_report(data_dir: str | os.PathLike, **entries: Any) -> Path:
    """Adds or replaces top-level keys of ``<data_dir>/data_report.json`` (atomic rewrite).

    For what later stages learn about the prepared data, e.g. training's length-filter counts
    (the report is written before the vocabulary exists). A missing report is started with just
    these keys; the ``stamp`` and the split checksums are left as they are.

    Raises:
      UserInputError: the report exists but is not a JSON object (the message names it).
    """
    path = Path(data_dir) / REPORT_NAME
    report: dict[str, Any] = {}
    if path.exists():
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise CorpusError(f"{path} is not valid JSON ({err}); remove it and run `aiayn data` "
                              "to rebuild it.") from None
        if not isinstance(report, dict):
            raise CorpusError(f"{path} is not a JSON object; remove it and run `aiayn data` to "
                              "rebuild it.")
    report.update(entries)
    return atomic_write(path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")


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
        paths += expand_files(part) or sorted(Path(p) for p in globlib.glob(f"{part}.*"))
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
        from aiayn.pipeline.data.bible.extract import package_versions
        inputs["packages"] = package_versions(d.bible_extra_sources)
        if d.bible_extra_sources:
            inputs["bible_extra_sources"] = list(d.bible_extra_sources)
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
            splits[split] = read_corpus(spec, d.format, drops=drops[split],
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
        source["heldout"] = (f"{d.heldout_size} pairs each for dev and test, drawn with seed "
                             f"{d.seed}")
    if not splits["train"]:
        raise CorpusError(f"Corpus {d.corpus!r} has no usable training pairs.")
    return splits, drops, source


def _bible_splits(cfg) -> tuple[dict[str, list[Pair]], dict[str, Drops], dict, dict]:
    from aiayn.pipeline.data.bible.build import build_bible_corpus
    from aiayn.pipeline.data.bible.extract import SOURCE_MODULE, TARGET_MODULE
    from aiayn.pipeline.data.bible.split import DEV_BOOKS, TEST_BOOKS

    extra = cfg.data.bible_extra_sources
    corpus = build_bible_corpus(seed=cfg.data.seed, extra_sources=extra)
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
                       "verse pairs read with mod2imp, split by whole books"
                       + (f"; the training books also from {', '.join(extra)} -> spaRV1909eb"
                          if extra else ""),
        "source_module": SOURCE_MODULE,
        "target_module": TARGET_MODULE,
        "packages": corpus.packages,
        "books": {"dev": list(DEV_BOOKS), "test": list(TEST_BOOKS),
                  "train": "every other book both modules have"},
        "cleanup": corpus.cleanup,
        "alignment": alignment,
    }
    if extra:
        source["extra_sources"] = corpus.extra_sources
    return splits, drops, source, corpus.alignment_report


def prepare_data(cfg) -> dict:
    """Builds ``<data_dir>/{train,dev,test}.tsv`` and ``data_report.json``; returns the report.

    Skips the work when the outputs exist, their checksums match the report and the inputs and
    data settings are unchanged (the report's ``stamp``).

    Raises:
      CorpusError: bad or missing input (see the module docstring).
      UserInputError: mod2imp or the SWORD modules missing for ``data.corpus=bible`` (with the
        apt command), or a held-out book absent from them.
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
        "length_unit": LENGTH_UNIT,
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
