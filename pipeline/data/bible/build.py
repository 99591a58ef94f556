"""The Bible corpus build: reads both modules, then runs the three steps in order.

:func:`build_bible_corpus` returns the pairs per split, the alignment report, the clean-up counts
and the Debian package versions.

Example::

    corpus = build_bible_corpus()
    corpus.splits["train"][0]   # ('In the beginning, God created ...', 'EN el principio crió ...')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from aiayn.pipeline.data.bible.align import AlignParams, align_books
from aiayn.pipeline.data.bible.extract import (
    APT_COMMAND,
    SOURCE_MODULE,
    TARGET_MODULE,
    load_books,
    package_versions,
    run_mod2imp,
)
from aiayn.pipeline.data.bible.split import DEV_BOOKS, TEST_BOOKS, split_by_book, split_of_book
from aiayn.pipeline.errors import UserInputError


@dataclasses.dataclass
class BibleCorpus:
    """Pairs per split, the alignment report, clean-up counts and Debian package versions.

    ``extra_sources`` has, per extra English module, the training pairs it added, its alignment
    counts and its clean-up counts.
    """

    splits: dict[str, list[tuple[str, str]]]
    alignment_report: dict
    cleanup: dict
    packages: dict[str, str]
    extra_sources: dict[str, dict] = dataclasses.field(default_factory=dict)


def build_bible_corpus(params: AlignParams = AlignParams(),  # noqa: B008 (frozen dataclass)
                       seed: int = 0, extra_sources: Sequence[str] = ()) -> BibleCorpus:
    """Reads both modules with mod2imp, cleans, aligns and splits them.

    Each module in ``extra_sources`` (another English version, e.g. ``engKJV2006eb``) is cleaned
    and aligned against the same Spanish module in the same way, and its pairs of the training
    books join train, each book's after the main module's: dev and test stay the main pair.

    Raises:
      UserInputError: mod2imp or a module is missing (the message has the apt command), or a
        dev/test book is absent from the modules.
    """
    source_text = run_mod2imp(SOURCE_MODULE)
    target_text = run_mod2imp(TARGET_MODULE)
    cleanup: dict = {}
    books = load_books(source_text, target_text, cleanup)
    absent = [b for b in DEV_BOOKS + TEST_BOOKS if b not in books]
    if absent:
        raise UserInputError(
            f"The SWORD modules lack the held-out books {absent}; books found: {list(books)}. "
            f"Reinstall them: sudo {APT_COMMAND}")
    aligned = align_books(books, params, seed=seed)
    pairs = {book: list(book_pairs) for book, book_pairs in aligned.pairs.items()}
    extras = {}
    for module in extra_sources:
        extras[module] = _add_training_pairs(pairs, module, target_text, params, seed)
    return BibleCorpus(split_by_book(pairs), aligned.report, cleanup,
                       package_versions(extra_sources), extras)


def _add_training_pairs(pairs: dict[str, list[tuple[str, str]]], module: str, target_text: str,
                        params: AlignParams, seed: int) -> dict:
    """Aligns ``module`` against the target and appends its training books' pairs to ``pairs``."""
    cleanup: dict = {}
    books = load_books(run_mod2imp(module), target_text, cleanup)
    aligned = align_books(books, params, seed=seed)
    added = 0
    for book, book_pairs in aligned.pairs.items():
        if split_of_book(book) == "train":
            pairs.setdefault(book, []).extend(book_pairs)
            added += len(book_pairs)
    report = {k: v for k, v in aligned.report.items() if k != "books"}
    return {"train_pairs": added, "alignment": report, "cleanup": cleanup}
