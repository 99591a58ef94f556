"""Step 3 of the Bible corpus: the fixed whole-book dev and test sets.

Dev and test are whole books (:data:`DEV_BOOKS`, :data:`TEST_BOOKS`); every other book is train.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aiayn.pipeline.data.bible.extract import canonical_book

# Book names as mod2imp prints them (roman numerals); `canonical_book` maps "1 Peter" etc. here.
DEV_BOOKS = ("Ruth", "Jonah", "Amos", "Lamentations", "Galatians", "Philippians", "James",
             "I Peter", "II Timothy")
TEST_BOOKS = ("Esther", "Ecclesiastes", "Daniel", "John", "I Corinthians")


def split_of_book(book: str) -> str:
    """``"dev"``, ``"test"`` or ``"train"`` for a book name (any spelling canonical_book knows)."""
    book = canonical_book(book)
    if book in DEV_BOOKS:
        return "dev"
    if book in TEST_BOOKS:
        return "test"
    return "train"


def split_by_book(pairs: Mapping[str, Sequence[tuple[str, str]]]
                  ) -> dict[str, list[tuple[str, str]]]:
    """Concatenates per-book pairs into train/dev/test by the fixed book lists."""
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "dev": [], "test": []}
    for book, book_pairs in pairs.items():
        splits[split_of_book(book)].extend(book_pairs)
    return splits
