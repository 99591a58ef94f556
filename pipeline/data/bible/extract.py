"""Step 1 of the Bible corpus: the SWORD modules -> clean verse text per book.

``mod2imp`` (Debian ``libsword-utils``) prints one ``$$$Book C:V`` entry of OSIS XML per verse
(:func:`run_mod2imp`); :func:`parse_imp` groups the entries by book, :func:`clean_osis` turns one
verse's markup into plain text, :func:`book_verses` cleans one book, and :func:`load_books` pairs
the books the two modules share. Everything but :func:`run_mod2imp` and :func:`package_versions`
works on text, so it is testable without ``mod2imp``.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence

from aiayn.pipeline.errors import UserInputError

SOURCE_MODULE = "engWEB2015eb"
TARGET_MODULE = "spaRV1909eb"
# More English versions of the training books (`data.bible_extra_sources`), each paired with
# the same Spanish verses: the King James Version (1769 text, keyed as RV1909 is).
EXTRA_SOURCE_MODULES = ("engKJV2006eb",)
# Debian package of each module, and of mod2imp.
PACKAGES = {SOURCE_MODULE: "sword-text-web", TARGET_MODULE: "sword-text-sparv",
            "engKJV2006eb": "sword-text-kjv", "mod2imp": "libsword-utils"}
APT_COMMAND = "apt-get install sword-text-web sword-text-sparv libsword-utils"

Key = tuple[int, int]  # (chapter, verse)


# --------------------------------------------------------------------------------------------
# Reading mod2imp output
# --------------------------------------------------------------------------------------------

def run_mod2imp(module: str) -> str:
    """Returns ``mod2imp <module>``'s output.

    Raises:
      UserInputError: ``mod2imp`` or the module is not installed (the message gives the apt
        command).
    """
    exe = shutil.which("mod2imp")
    if exe is None:
        raise UserInputError(
            "The default corpus needs `mod2imp` (Debian package libsword-utils) and the SWORD "
            f"modules {SOURCE_MODULE} and {TARGET_MODULE}; `mod2imp` is not on PATH. Install "
            f"them with: sudo {APT_COMMAND}  (or `make system-deps`), or set data.corpus to your "
            "own parallel corpus.")
    proc = subprocess.run([exe, module], capture_output=True, timeout=600)
    text = proc.stdout.decode("utf-8", errors="replace")
    if proc.returncode != 0 or "$$$" not in text or not re.search(r"^\$\$\$.+ \d+:\d+$", text,
                                                                   re.M):
        package = PACKAGES.get(module, "?")
        install = APT_COMMAND if module in (SOURCE_MODULE, TARGET_MODULE) else (
            f"apt-get install {package}")
        raise UserInputError(
            f"`mod2imp {module}` printed no verses (exit status {proc.returncode}): the SWORD "
            f"module {module} (Debian package {package}) seems missing. Install it with: "
            f"sudo {install}  (or `make system-deps`)")
    return text


_ENTRY = re.compile(r"^\$\$\$(.+?) (\d+):(\d+)[ \t]*$")


def parse_imp(text: str) -> dict[str, dict[Key, str]]:
    """Parses mod2imp output into ``{book: {(chapter, verse): osis_markup}}``.

    Module and testament headings (``$$$[ Module Heading ]``) are skipped; book names are
    normalised with :func:`canonical_book`; book order is kept.
    """
    books: dict[str, dict[Key, str]] = {}
    current: list[str] | None = None
    for line in text.split("\n"):
        if line.startswith("$$$"):
            match = _ENTRY.match(line)
            current = None
            if match:
                book = canonical_book(match.group(1))
                key = (int(match.group(2)), int(match.group(3)))
                current = []
                books.setdefault(book, {})[key] = current  # type: ignore[assignment]
        elif current is not None:
            current.append(line)
    return {b: {k: "\n".join(v).strip() for k, v in entries.items()}  # type: ignore[misc]
            for b, entries in books.items()}


_ROMAN = {"1": "I", "2": "II", "3": "III", "4": "IV"}
_ALIASES = {"Revelation": "Revelation of John", "Song of Songs": "Song of Solomon",
            "Psalm": "Psalms"}


def canonical_book(name: str) -> str:
    """``"1 Peter"``, ``"1Peter"`` or ``"I Peter"`` -> ``"I Peter"`` (mod2imp's spelling)."""
    name = " ".join(name.split())
    match = re.match(r"^([1-4])\s*(\S.*)$", name)
    if match:
        name = f"{_ROMAN[match.group(1)]} {match.group(2)}"
    return _ALIASES.get(name, name)


# --------------------------------------------------------------------------------------------
# OSIS clean-up
# --------------------------------------------------------------------------------------------

_TAG = re.compile(r"<(/?)([A-Za-z][\w:.-]*)((?:[^>\"']|\"[^\"]*\"|'[^']*')*?)(/?)>")
# Elements dropped with their content.
_DROP_ELEMENTS = {"note", "speaker", "rdg", "reference"}
# Inline elements: their tags vanish (text runs on), except that between two letters they leave
# a space (clean_osis).
_INLINE = {"w", "transChange", "q", "name", "seg", "hi", "foreign", "divineName", "catchWord",
           "abbr", "added", "inscription", "rf", "a", "index", "milestone"}


def _is_canonical(attrs: str) -> bool:
    return re.search(r"""canonical\s*=\s*["']true["']""", attrs) is not None


def clean_osis(markup: str) -> str:
    """OSIS markup of one verse -> plain text with normalised whitespace.

    Drops ``<note>`` (footnotes, cross references) with their content, non-canonical
    ``<title>`` elements (section headings), ``<speaker>`` labels, ``<rdg>`` (variant readings)
    and ``<reference>``; keeps the words of ``<w>`` and other inline elements and the text of
    canonical titles (Psalm superscriptions). Tags of block elements (``<l>``, ``<lg>``,
    ``<div>``, ``<lb/>``, titles) become spaces, except before punctuation; inline tags vanish,
    except that between two letters they become a space (RV1909 has
    ``<transChange>enviada</transChange><w>por</w>``). Entities are unescaped.

    Example::

        >>> clean_osis('<w lemma="x">In</w> the<note>A note</note> <title>Heading</title>end.')
        'In the end.'
    """
    out: list[str] = []
    stack: list[tuple[str, bool]] = []  # (element, dropping)
    pos = 0
    for match in _TAG.finditer(markup):
        dropping = bool(stack) and stack[-1][1]
        if not dropping:
            out.append(markup[pos:match.start()])
        pos = match.end()
        closing, name, attrs, self_closing = match.groups()
        if not closing and not self_closing:
            drop = dropping or name in _DROP_ELEMENTS or (
                name == "title" and not _is_canonical(attrs))
            stack.append((name, drop))
        elif closing:
            # Pop to the matching open tag; a close tag without one (its element was opened in
            # an earlier verse) is ignored.
            for depth in range(len(stack) - 1, -1, -1):
                if stack[depth][0] == name:
                    del stack[depth:]
                    break
        if not (bool(stack) and stack[-1][1]):
            out.append("\x01" if name in _INLINE else "\x00")
    if not (stack and stack[-1][1]):
        out.append(markup[pos:])
    text = "".join(out)
    # An inline tag between two letters is a word boundary; elsewhere it vanishes.
    text = re.sub(r"(?<=\w)\x01+(?=\w)", " ", text)
    text = text.replace("\x01", "")
    # Block tags and whitespace before punctuation leave no space ("word<l/> ," -> "word,").
    text = re.sub(r"[\x00\s]+(?=[,.;:!?)\]])", "", text)
    text = html.unescape(text.replace("\x00", " "))
    # The KJV marks paragraphs with a pilcrow in the text ("¶ Ye shall not ..."): not a word.
    return normalize_whitespace(text.replace("\u00b6", " "))


def normalize_whitespace(text: str) -> str:
    """Collapses runs of whitespace (tabs and newlines included) to one space; strips."""
    return " ".join(text.split())


_CANONICAL_TITLE = re.compile(
    r"<title\b(?=[^>]*canonical\s*=\s*[\"']true[\"'])[^>]*>(.*?)</title>", re.S)
# RV1909 subscriptions after the last verse of the epistles: "Amén. Fué escrita de Corinto ...".
_COLOPHON = re.compile(
    r"^(.*\bAm[eé]n[.!]?)\s+(?=\S)(?:[^.]*\b(?:[Ee]scrita|[Ee]nviada|[Ee]scrito)\b[^.]*\.?)\s*$")


def strip_colophon(text: str) -> tuple[str, bool]:
    """Removes a RV1909-style colophon after the final "Amén."; returns (text, removed)."""
    match = _COLOPHON.match(text)
    if match:
        return match.group(1), True
    return text, False


def book_verses(entries: Mapping[Key, str], *, strip_colophons: bool = False,
                stats: Counter | None = None) -> dict[Key, str]:
    """One book's raw entries -> ``{(chapter, verse): clean text}``.

    Chapter 0 (book introductions) and verse 0 are dropped, except that a canonical title in
    verse 0 (a Psalm superscription in some WEB releases) is prepended to verse 1. Empty verses
    are dropped. With ``strip_colophons``, a colophon after the last verse's "Amén." goes
    (:func:`strip_colophon`). Counts of what was dropped, moved or stripped go to ``stats``.
    """
    stats = stats if stats is not None else Counter()
    verses: dict[Key, str] = {}
    superscriptions: dict[int, str] = {}
    for (chapter, verse), markup in entries.items():
        if chapter == 0:
            stats["introduction"] += 1
            continue
        if verse == 0:
            titles = [clean_osis(t) for t in _CANONICAL_TITLE.findall(markup)]
            titles = [t for t in titles if t]
            if titles:
                superscriptions[chapter] = " ".join(titles)
            continue
        text = clean_osis(markup)
        if not text:
            stats["empty_verse"] += 1
            continue
        verses[(chapter, verse)] = text
    for chapter, title in superscriptions.items():
        if (chapter, 1) in verses:
            verses[(chapter, 1)] = f"{title} {verses[(chapter, 1)]}"
            stats["superscription_from_verse_0"] += 1
    if strip_colophons and verses:
        last = max(verses)
        verses[last], removed = strip_colophon(verses[last])
        stats["colophon_stripped"] += int(removed)
    return dict(sorted(verses.items()))


def load_books(source_text: str, target_text: str, stats: dict | None = None
               ) -> dict[str, tuple[dict[Key, str], dict[Key, str]]]:
    """Two mod2imp outputs -> ``{book: (source_verses, target_verses)}`` for shared books.

    Colophons are stripped from the target side of New Testament books. Clean-up counts per side,
    and the books (with their verse counts) that only one module has, go to ``stats``.
    """
    src_books, tgt_books = parse_imp(source_text), parse_imp(target_text)
    stats = stats if stats is not None else {}
    src_stats, tgt_stats = Counter(), Counter()
    books = {}
    missing: dict[str, int] = {}
    for book, entries in src_books.items():
        if book not in tgt_books:
            missing[book] = sum(1 for (c, v) in entries if c > 0 and v > 0)
            continue
        nt = book in _NT_BOOKS
        books[book] = (book_verses(entries, stats=src_stats),
                       book_verses(tgt_books[book], strip_colophons=nt, stats=tgt_stats))
    stats["source"] = dict(src_stats)
    stats["target"] = dict(tgt_stats)
    stats["books_without_target"] = missing
    stats["books_without_target_verses"] = sum(missing.values())
    stats["target_only_books"] = [b for b in tgt_books if b not in src_books]
    return books


_NT_BOOKS = {"Matthew", "Mark", "Luke", "John", "Acts", "Romans", "I Corinthians",
             "II Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians",
             "I Thessalonians", "II Thessalonians", "I Timothy", "II Timothy", "Titus", "Philemon",
             "Hebrews", "James", "I Peter", "II Peter", "I John", "II John", "III John", "Jude",
             "Revelation of John"}


def package_versions(extra_sources: Sequence[str] = ()) -> dict[str, str]:
    """Debian package versions of the two modules, the ``extra_sources`` modules and mod2imp.

    ``"not installed"`` where dpkg-query knows no such package, ``"unknown"`` where it can't run.
    """
    modules = (SOURCE_MODULE, TARGET_MODULE, *extra_sources, "mod2imp")
    versions = {}
    for package in sorted({PACKAGES[m] for m in modules}):
        try:
            proc = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                                  capture_output=True, text=True, timeout=30)
            versions[package] = proc.stdout.strip() if proc.returncode == 0 else "not installed"
        except (OSError, subprocess.SubprocessError):
            versions[package] = "unknown"
    return versions
