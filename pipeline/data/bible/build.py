"""The Bible corpus build: reads both modules, then runs the three steps in order.

:func:`build_bible_corpus` returns the pairs per split, the alignment report, the clean-up counts
and the Debian package versions.

Example::

    corpus = build_bible_corpus()
    corpus.splits["train"][0]   # ('In the beginning, God created ...', 'EN el principio crió ...')
"""

from __future__ import annotations

import dataclasses

from aiayn.pipeline.data.bible.align import AlignParams, align_books
from aiayn.pipeline.data.bible.extract import (
    APT_COMMAND,
    SOURCE_MODULE,
    TARGET_MODULE,
    load_books,
    package_versions,
    run_mod2imp,
)
from aiayn.pipeline.data.bible.split import DEV_BOOKS, TEST_BOOKS, split_by_book
from aiayn.pipeline.errors import UserInputError


@dataclasses.dataclass
class BibleCorpus:
    """Pairs per split, the alignment report, clean-up counts and Debian package versions."""

    splits: dict[str, list[tuple[str, str]]]
    alignment_report: dict
    cleanup: dict
    packages: dict[str, str]


def build_bible_corpus(params: AlignParams = AlignParams(),  # noqa: B008 (frozen dataclass)
                       seed: int = 0) -> BibleCorpus:
    """Reads both modules with mod2imp, cleans, aligns and splits them.

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
    return BibleCorpus(split_by_book(aligned.pairs), aligned.report, cleanup, package_versions())
