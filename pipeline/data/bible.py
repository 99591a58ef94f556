"""The default corpus: English (World English Bible) -> Spanish (Reina-Valera 1909) verse pairs.

Both Bibles are public-domain SWORD modules packaged by Debian (``sword-text-web`` ->
``engWEB2015eb``, ``sword-text-sparv`` -> ``spaRV1909eb``) and read with ``mod2imp``
(``libsword-utils``), which prints one ``$$$Book C:V`` entry of OSIS XML per verse.

Three steps, each testable without ``mod2imp``:

1. :func:`parse_imp` and :func:`clean_osis`: entries -> plain verse text. Notes (with their
   content), non-canonical titles/headings and speaker labels go; the words of ``<w>``,
   ``<transChange>``, ``<q>`` and other inline tags stay; canonical Psalm superscriptions stay
   (RV1909 prints them inside verse 1, WEB as ``<title canonical="true">`` in verse 1 or 0).
   :func:`book_verses` drops book introductions (chapter 0), verse 0 (except a canonical title,
   which is moved to verse 1), empty verses, and the RV1909 colophons after the last verse of
   the epistles ("... Amén. Fué escrita de Corinto ...").
2. :func:`align_books`: RV1909 is keyed by KJV references, but its text follows the
   Hebrew/Spanish verse division in some chapters (Num 12:16 is RV's 13:1 and the whole of Num 13
   runs one key late; Jonah 1:17/2:1; merges such as 2 Cor 13:12-13). Every pair is scored with
   a lexical translation table learned from the data (:class:`LexicalModel`: Dice association on
   the key-aligned majority, top translations per word, IDF-weighted coverage in both directions,
   times a length-ratio factor). The score threshold is calibrated on the data itself: deliberately
   shifted pairs are scored, and the threshold keeps at most 1% of them. Chapters where every
   key-aligned pair clears the threshold are kept as they are; every other chapter (with its
   neighbours' run of suspicious chapters, so that verses moved across a chapter boundary are
   found) is re-aligned by a banded monotone dynamic program over 1-1, 2-1, 1-2 and skip beads
   within +-4 positions of its key. A bead is kept only when its score clears the threshold, so no
   pair below the threshold reaches training; what cannot be aligned is dropped with a reason.
3. :func:`split_by_book`: fixed whole-book dev/test sets (:data:`DEV_BOOKS`, :data:`TEST_BOOKS`).

:func:`build_bible_corpus` runs the three and returns pairs per split, the alignment report and
the package versions. Example::

    corpus = build_bible_corpus()
    corpus.splits["train"][0]   # ('In the beginning, God created ...', 'EN el principio crió ...')
"""

from __future__ import annotations

import bisect
import dataclasses
import html
import math
import re
import shutil
import subprocess
import unicodedata
from collections import Counter, defaultdict
from typing import Iterable, Mapping, Sequence

import numpy as np

from aiayn.pipeline.errors import UserInputError

SOURCE_MODULE = "engWEB2015eb"
TARGET_MODULE = "spaRV1909eb"
# Debian package of each module, and of mod2imp.
PACKAGES = {SOURCE_MODULE: "sword-text-web", TARGET_MODULE: "sword-text-sparv",
            "mod2imp": "libsword-utils"}
APT_COMMAND = "apt-get install sword-text-web sword-text-sparv libsword-utils"

# Book names as mod2imp prints them (roman numerals); `canonical_book` maps "1 Peter" etc. here.
DEV_BOOKS = ("Ruth", "Jonah", "Amos", "Lamentations", "Galatians", "Philippians", "James",
             "I Peter", "II Timothy")
TEST_BOOKS = ("Esther", "Ecclesiastes", "Daniel", "John", "I Corinthians")

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
        raise UserInputError(
            f"`mod2imp {module}` printed no verses (exit status {proc.returncode}): the SWORD "
            f"module {module} (Debian package {package}) seems missing. Install it with: "
            f"sudo {APT_COMMAND}")
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
# Inline elements: their tags vanish without leaving a space (text runs on).
_INLINE = {"w", "transChange", "q", "name", "seg", "hi", "foreign", "divineName", "catchWord",
           "abbr", "added", "inscription", "rf", "a", "index", "milestone"}


def _is_canonical(attrs: str) -> bool:
    return re.search(r"""canonical\s*=\s*["']true["']""", attrs) is not None


def clean_osis(markup: str) -> str:
    """OSIS markup of one verse -> plain text with normalised whitespace.

    Drops ``<note>`` (footnotes, cross references) with their content, non-canonical
    ``<title>`` elements (section headings) and ``<speaker>`` labels; keeps the words of ``<w>``
    and other inline elements and the text of canonical titles (Psalm superscriptions). Tags of
    block elements (``<l>``, ``<lg>``, ``<div>``, ``<lb/>``, titles) become spaces; a space is also
    put where two inline elements meet between letters (RV1909 has
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
            # Pop to the matching open tag; a close tag opened in an earlier verse is ignored.
            for depth in range(len(stack) - 1, -1, -1):
                if stack[depth][0] == name:
                    del stack[depth:]
                    break
        if not (bool(stack) and stack[-1][1]):
            out.append("\x01" if name in _INLINE else "\x00")
    if not (stack and stack[-1][1]):
        out.append(markup[pos:])
    text = "".join(out)
    # Inline boundary between two letters is a word boundary; elsewhere it vanishes.
    text = re.sub(r"(?<=\w)\x01+(?=\w)", " ", text)
    text = text.replace("\x01", "")
    # A block tag before punctuation leaves no space ("word<l/>," -> "word,").
    text = re.sub(r"[\x00\s]+(?=[,.;:!?)\]])", "", text)
    text = html.unescape(text.replace("\x00", " "))
    return normalize_whitespace(text)


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
    are dropped. Counts of what was dropped go to ``stats``.
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


# --------------------------------------------------------------------------------------------
# Lexical model and scoring
# --------------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+", re.UNICODE)


def _stem(word: str) -> str:
    """First three letters without accents: a crude key for names across the two languages."""
    return unicodedata.normalize("NFKD", word).encode("ascii", "ignore").decode()[:3]


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens (letters and digits)."""
    return _WORD.findall(text.lower())


Features = tuple[frozenset, int]  # (word set, character length)


def features(text: str) -> Features:
    """What the scorer needs of a text: its set of words and its length."""
    return frozenset(tokenize(text)), len(text)


def join_features(parts: Sequence[Features]) -> Features:
    """Features of the concatenation of texts (for merged verses)."""
    return frozenset().union(*(p[0] for p in parts)), sum(p[1] for p in parts) + len(parts) - 1


class LexicalModel:
    """A quick translation table learned from roughly aligned pairs, and a pair score.

    For every word on each side, the ``top_k`` words of the other side with the highest Dice
    coefficient ``2 c(e, f) / (df(e) + df(f))`` over the training pairs are its translations.
    :meth:`score` is the IDF-weighted share of words on each side that have a translation (or the
    same spelling: names, numbers) on the other side, averaged over both directions, times a
    length-ratio factor. About 0 for unrelated texts and 0.5-0.9 for translations.
    """

    def __init__(self, pairs: Sequence[tuple[str, str]], top_k: int = 4, min_count: int = 2,
                 min_dice: float = 0.05):
        tok_s = [set(tokenize(s)) for s, _ in pairs]
        tok_t = [set(tokenize(t)) for _, t in pairs]
        n = max(len(pairs), 1)
        df_s = Counter(w for toks in tok_s for w in toks)
        df_t = Counter(w for toks in tok_t for w in toks)
        self.idf_s = {w: math.log((n + 1) / (c + 0.5)) for w, c in df_s.items()}
        self.idf_t = {w: math.log((n + 1) / (c + 0.5)) for w, c in df_t.items()}
        self.default_idf = math.log(n + 1)
        vocab_s = sorted(w for w, c in df_s.items() if c >= min_count)
        vocab_t = sorted(w for w, c in df_t.items() if c >= min_count)
        id_s = {w: i for i, w in enumerate(vocab_s)}
        id_t = {w: i for i, w in enumerate(vocab_t)}
        nt = max(len(vocab_t), 1)
        codes = []
        for a, b in zip(tok_s, tok_t):
            ia = np.fromiter((id_s[w] for w in a if w in id_s), dtype=np.int64)
            ib = np.fromiter((id_t[w] for w in b if w in id_t), dtype=np.int64)
            if ia.size and ib.size:
                codes.append(np.add.outer(ia * nt, ib).ravel())
        self.trans_s: dict[str, frozenset[str]] = {}
        self.trans_t: dict[str, frozenset[str]] = {}
        if not codes:
            return
        uniq, counts = np.unique(np.concatenate(codes), return_counts=True)
        ia, ib = uniq // nt, uniq % nt
        dfa = np.array([df_s[w] for w in vocab_s], dtype=np.float64)
        dfb = np.array([df_t[w] for w in vocab_t], dtype=np.float64)
        dice = 2.0 * counts / (dfa[ia] + dfb[ib])
        keep = dice >= min_dice
        ia, ib, dice = ia[keep], ib[keep], dice[keep]
        for table, own, other, own_vocab, other_vocab in (
                (self.trans_s, ia, ib, vocab_s, vocab_t), (self.trans_t, ib, ia, vocab_t, vocab_s)):
            order = np.lexsort((-dice, own))
            own_sorted, other_sorted = own[order], other[order]
            starts = np.flatnonzero(np.r_[True, own_sorted[1:] != own_sorted[:-1]])
            ends = np.r_[starts[1:], own_sorted.size]
            for start, end in zip(starts, ends):
                table[own_vocab[own_sorted[start]]] = frozenset(
                    other_vocab[j] for j in other_sorted[start:min(end, start + top_k)])

    def _coverage(self, words: Iterable[str], other: set[str], table: Mapping[str, frozenset],
                  idf: Mapping[str, float]) -> tuple[float, float]:
        hit = total = 0.0
        other_stems: set[str] | None = None
        for w in set(words):
            weight = idf.get(w, self.default_idf)
            translations = table.get(w)
            if w in other or (translations and not translations.isdisjoint(other)):
                total += weight
                hit += weight
            elif translations is not None:
                total += weight
            elif len(w) >= 4 and not w.isdigit():
                # A rare word (mostly names: Hazeroth / Haseroth): a similar spelling counts.
                if other_stems is None:
                    other_stems = {_stem(x) for x in other if len(x) >= 4}
                total += weight
                hit += weight * (_stem(w) in other_stems)
        return hit, total

    def score(self, source: str, target: str) -> float:
        """Similarity in [0, 1] of a source and a target text."""
        return self.score_features(features(source), features(target))

    def score_features(self, source: Features, target: Features) -> float:
        """:meth:`score` on precomputed :func:`features` (what the aligner calls)."""
        ss, ls = source
        st, lt = target
        if not ss or not st:
            return 0.0
        hs, ts = self._coverage(ss, st, self.trans_s, self.idf_s)
        ht, tt = self._coverage(st, ss, self.trans_t, self.idf_t)
        if ts == 0 or tt == 0:
            return 0.0
        lexical = 0.5 * (hs / ts + ht / tt)
        ratio = math.log((lt + 10) / (ls + 10))
        return lexical * math.exp(-max(0.0, abs(ratio) - 0.4))


# --------------------------------------------------------------------------------------------
# Alignment
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AlignParams:
    """Knobs of the aligner (defaults measured on WEB/RV1909; see the data report)."""

    band: int = 4                 # a bead's keys may be this many positions apart
    merge_penalty: float = 0.03   # a 2-1 / 1-2 bead must beat the 1-1 reading by this much
    same_key_bonus: float = 0.01  # prefers the key-aligned reading on ties
    margin: float = 0.02          # a kept pair may trail a neighbouring reading by this much
    calibration_quantile: float = 0.95  # floor: at most 5% of shifted (wrong) pairs reach it
    min_threshold: float = 0.3
    max_threshold: float = 0.5


@dataclasses.dataclass
class Bead:
    """One aligned unit: one or two source verses against one or two target verses."""

    source_keys: tuple[Key, ...]
    target_keys: tuple[Key, ...]
    source: str
    target: str
    score: float

    @property
    def kind(self) -> str:
        if len(self.source_keys) == 1 and len(self.target_keys) == 1:
            return "identity" if self.source_keys == self.target_keys else "shift"
        return "merge"


@dataclasses.dataclass
class BookAlignment:
    """The aligned beads of one book and what was repaired or dropped, per chapter."""

    beads: list[Bead]
    repairs: list[dict]
    drops: list[dict]


def _fmt(keys: Sequence[Key]) -> str:
    return "+".join(f"{c}:{v}" for c, v in keys)


def align_verses(source: Mapping[Key, str], target: Mapping[Key, str], model: LexicalModel,
                 threshold: float, params: AlignParams = AlignParams()) -> BookAlignment:
    """Aligns one book's verses, given as ``{(chapter, verse): text}`` on each side.

    Key-aligned pairs of chapters that look fine (same verse keys, every score >= threshold) are
    kept. Runs of other chapters are re-aligned by a banded dynamic program (see the module
    docstring). Every kept bead scores at least ``threshold``.
    """
    chapters = sorted({c for c, _ in source} | {c for c, _ in target})
    src_by_ch: dict[int, list[Key]] = defaultdict(list)
    tgt_by_ch: dict[int, list[Key]] = defaultdict(list)
    for k in source:
        src_by_ch[k[0]].append(k)
    for k in target:
        tgt_by_ch[k[0]].append(k)
    fs = {k: features(t) for k, t in source.items()}
    ft = {k: features(t) for k, t in target.items()}
    score = model.score_features
    identity: dict[Key, float] = {}
    suspicious = []
    for c in chapters:
        keys = sorted(src_by_ch[c])
        ok = keys == sorted(tgt_by_ch[c])
        for n, k in enumerate(keys):
            if not ok:
                break
            identity[k] = score(fs[k], ft[k])
            # Confident: above the floor and not beaten by a neighbour (a shifted reading).
            ok = identity[k] >= threshold
            for other in keys[max(0, n - 1):n] + keys[n + 1:n + 2]:
                ok = ok and identity[k] + params.margin >= max(
                    score(fs[k], ft[other]), score(fs[other], ft[k]))
        suspicious.append(not ok)
    beads: list[Bead] = []
    repairs: list[dict] = []
    drops: list[dict] = []
    i = 0
    while i < len(chapters):
        if not suspicious[i]:
            c = chapters[i]
            for k in sorted(src_by_ch[c]):
                beads.append(Bead((k,), (k,), source[k], target[k], identity[k]))
            i += 1
            continue
        j = i
        while j < len(chapters) and suspicious[j]:
            j += 1
        block = chapters[i:j]
        src_keys = sorted(k for c in block for k in src_by_ch[c])
        tgt_keys = sorted(k for c in block for k in tgt_by_ch[c])
        b, r, d = _align_block(src_keys, tgt_keys, source, target, fs, ft, model, threshold,
                               params)
        beads += b
        repairs += r
        drops += d
        i = j
    return BookAlignment(beads, repairs, drops)


def _align_block(src_keys: list[Key], tgt_keys: list[Key], source: Mapping[Key, str],
                 target: Mapping[Key, str], fs: Mapping[Key, Features],
                 ft: Mapping[Key, Features], model: LexicalModel, threshold: float,
                 params: AlignParams) -> tuple[list[Bead], list[dict], list[dict]]:
    """Banded monotone DP over 1-1, 2-1, 1-2, 1-0 and 0-1 beads; maximises sum(score - t)."""
    union = {k: n for n, k in enumerate(sorted(set(src_keys) | set(tgt_keys)))}
    ps = [union[k] for k in src_keys]
    pt = [union[k] for k in tgt_keys]
    n, m = len(src_keys), len(tgt_keys)
    neg = -1e18
    best = np.full((n + 1, m + 1), neg)
    back: dict[tuple[int, int], tuple[int, int, float]] = {}
    best[0, 0] = 0.0
    cache: dict[tuple[int, int, int, int], float] = {}

    def near(a: int, b: int) -> bool:  # source item a and target item b may share a bead
        return abs(ps[a] - pt[b]) <= params.band

    def bead_score(i0: int, i1: int, j0: int, j1: int) -> float:
        key = (i0, i1, j0, j1)
        if key not in cache:
            cache[key] = model.score_features(
                join_features([fs[k] for k in src_keys[i0:i1]]),
                join_features([ft[k] for k in tgt_keys[j0:j1]]))
        return cache[key]

    width = 2 * params.band + 2
    for i in range(n + 1):
        # Only states near the band (plus the borders, so the end is always reachable).
        if 0 < i < n:
            lo = bisect.bisect_left(pt, ps[i - 1] - width)
            hi = bisect.bisect_right(pt, ps[i - 1] + width)
            cols = sorted({0, m} | set(range(lo + 1, hi + 1)))
        else:
            cols = range(m + 1)
        for j in cols:
            if i == 0 and j == 0:
                continue
            cands: list[tuple[float, int, int, float]] = []
            if i >= 1 and best[i - 1, j] > neg:
                cands.append((best[i - 1, j], i - 1, j, 0.0))
            if j >= 1 and best[i, j - 1] > neg:
                cands.append((best[i, j - 1], i, j - 1, 0.0))
            if i >= 1 and j >= 1 and near(i - 1, j - 1):
                if best[i - 1, j - 1] > neg:
                    s = bead_score(i - 1, i, j - 1, j)
                    bonus = params.same_key_bonus if src_keys[i - 1] == tgt_keys[j - 1] else 0.0
                    if s >= threshold:
                        cands.append((best[i - 1, j - 1] + s - threshold + bonus, i - 1, j - 1, s))
                if i >= 2 and best[i - 2, j - 1] > neg and near(i - 2, j - 1):
                    s = bead_score(i - 2, i, j - 1, j)
                    if s >= threshold:
                        cands.append((best[i - 2, j - 1] + s - threshold - params.merge_penalty,
                                      i - 2, j - 1, s))
                if j >= 2 and best[i - 1, j - 2] > neg and near(i - 1, j - 2):
                    s = bead_score(i - 1, i, j - 2, j)
                    if s >= threshold:
                        cands.append((best[i - 1, j - 2] + s - threshold - params.merge_penalty,
                                      i - 1, j - 2, s))
            if cands:
                total, pi, pj, s = max(cands, key=lambda c: c[0])
                best[i, j] = total
                back[(i, j)] = (pi, pj, s)
    beads: list[Bead] = []
    repairs: list[dict] = []
    drops: list[dict] = []
    i, j = n, m
    path = []
    while (i, j) != (0, 0):
        pi, pj, s = back[(i, j)]
        path.append((pi, i, pj, j, s))
        i, j = pi, pj
    for i0, i1, j0, j1, s in reversed(path):
        sk, tk = tuple(src_keys[i0:i1]), tuple(tgt_keys[j0:j1])
        if sk and tk and len(sk) == len(tk) == 1 and not _locally_best(
                i0, j0, s, src_keys, tgt_keys, bead_score, params):
            drops.append({"side": "source", "key": _fmt(sk), "reason": "ambiguous"})
            drops.append({"side": "target", "key": _fmt(tk), "reason": "ambiguous"})
        elif sk and tk:
            bead = Bead(sk, tk, " ".join(source[k] for k in sk),
                        " ".join(target[k] for k in tk), s)
            beads.append(bead)
            if bead.kind != "identity":
                repairs.append({"kind": bead.kind, "source": _fmt(sk), "target": _fmt(tk),
                                "score": round(s, 3)})
        elif sk:
            reason = "no_target_verse" if sk[0] not in target else "unaligned"
            drops.append({"side": "source", "key": _fmt(sk), "reason": reason})
        else:
            reason = "no_source_verse" if tk[0] not in source else "unaligned"
            drops.append({"side": "target", "key": _fmt(tk), "reason": reason})
    return beads, repairs, drops


def _jaccard(a: str, b: str) -> float:
    sa, sb = set(tokenize(a)), set(tokenize(b))
    return len(sa & sb) / max(1, len(sa | sb))


def _locally_best(i: int, j: int, s: float, src_keys: Sequence[Key], tgt_keys: Sequence[Key],
                  bead_score, params: AlignParams) -> bool:
    """True when pair (i, j) is not beaten by source i or target j with a neighbouring verse."""
    rivals = [bead_score(i, i + 1, jj, jj + 1) for jj in (j - 1, j + 1)
              if 0 <= jj < len(tgt_keys)]
    rivals += [bead_score(ii, ii + 1, j, j + 1) for ii in (i - 1, i + 1)
               if 0 <= ii < len(src_keys)]
    return all(s + params.margin >= r for r in rivals)


def shifted_pairs(books: Mapping[str, tuple[Mapping[Key, str], Mapping[Key, str]]],
                  model: LexicalModel, offsets: Sequence[int] = (1, 2),
                  min_identity: float = 0.6, max_samples: int = 6000,
                  seed: int = 0) -> list[tuple[str, str]]:
    """Known-wrong pairs for calibration: source verse a against target verse b = a + offset.

    Only taken where both key-aligned pairs (a, a) and (b, b) score at least ``min_identity``
    (so the region is aligned and the shifted pair is wrong) and the two source verses differ
    (Jaccard < 0.5: repeated verses such as Numbers 7's offerings are not wrong pairs).
    """
    rng = np.random.default_rng(seed)
    candidates = []
    for src, tgt in books.values():
        keys = [k for k in src if k in tgt]
        for off in offsets:
            candidates += [(src, tgt, a, b) for a, b in zip(keys, keys[off:])]
    if len(candidates) > max_samples:
        idx = rng.choice(len(candidates), size=max_samples, replace=False)
        candidates = [candidates[i] for i in sorted(idx)]
    wrong = []
    for src, tgt, a, b in candidates:
        if (_jaccard(src[a], src[b]) < 0.5 and _jaccard(tgt[a], tgt[b]) < 0.5
                and model.score(src[a], tgt[a]) >= min_identity
                and model.score(src[b], tgt[b]) >= min_identity):
            wrong += [(src[a], tgt[b]), (src[b], tgt[a])]
    return wrong


def calibrate_threshold(model: LexicalModel, wrong: Sequence[tuple[str, str]],
                        params: AlignParams = AlignParams()) -> float:
    """The score that at most ``1 - calibration_quantile`` of known-wrong pairs reach."""
    if not wrong:
        return params.min_threshold
    scores = np.array([model.score(s, t) for s, t in wrong])
    t = float(np.quantile(scores, params.calibration_quantile))
    return float(min(max(t, params.min_threshold), params.max_threshold))


@dataclasses.dataclass
class AlignmentResult:
    """Aligned pairs per book and the alignment report (JSON-ready)."""

    pairs: dict[str, list[tuple[str, str]]]
    report: dict


def align_books(books: Mapping[str, tuple[Mapping[Key, str], Mapping[Key, str]]],
                params: AlignParams = AlignParams(), seed: int = 0) -> AlignmentResult:
    """Aligns every book: learns the lexical model, calibrates the threshold, re-aligns.

    Args:
      books: ``{book: (source_verses, target_verses)}``, each ``{(chapter, verse): text}``.

    Returns:
      Pairs per book (in verse order) and a report with the threshold, counts and, per book and
      chapter, the repairs and drops.
    """
    # The confidently key-aligned majority: chapters with the same verse keys on both sides.
    train_pairs = []
    for src, tgt in books.values():
        for c in {k[0] for k in src}:
            ks = sorted(k for k in src if k[0] == c)
            if ks == sorted(k for k in tgt if k[0] == c):
                train_pairs += [(src[k], tgt[k]) for k in ks]
    model = LexicalModel(train_pairs)
    threshold = calibrate_threshold(model, shifted_pairs(books, model, seed=seed), params)
    pairs: dict[str, list[tuple[str, str]]] = {}
    per_book: dict[str, dict] = {}
    counts: Counter = Counter()
    for book, (src, tgt) in books.items():
        result = align_verses(src, tgt, model, threshold, params)
        pairs[book] = [(b.source, b.target) for b in result.beads]
        for b in result.beads:
            counts[f"beads_{b.kind}"] += 1
        counts["repairs"] += len(result.repairs)
        for d in result.drops:
            counts[f"dropped_{d['side']}_verses"] += len(d["key"].split("+"))
            counts[f"dropped_{d['reason']}"] += 1
        if result.repairs or result.drops:
            chapters: dict[str, dict] = defaultdict(lambda: {"repairs": [], "drops": []})
            for r in result.repairs:
                chapters[r["source"].split(":")[0]]["repairs"].append(r)
            for d in result.drops:
                chapters[d["key"].split(":")[0]]["drops"].append(d)
            per_book[book] = {"chapters": dict(sorted(chapters.items(), key=lambda x: int(x[0])))}
    report = {
        "method": "Dice translation table (top 4 per word) on key-aligned chapters; IDF-weighted "
                  "two-way coverage x length factor; banded DP (1-1, 2-1, 1-2, skip) on chapters "
                  "with a key mismatch or a key-aligned pair below the threshold",
        "threshold": round(threshold, 4),
        "threshold_rule": f"{params.calibration_quantile:.0%} quantile of scores of verse pairs "
                          "shifted by 1 and 2 keys (clipped to "
                          f"[{params.min_threshold}, {params.max_threshold}]); a kept pair must "
                          "also score at least its neighbouring readings",
        "lexicon_training_pairs": len(train_pairs),
        "aligned_pairs": sum(len(p) for p in pairs.values()),
        "realigned_pairs": counts["beads_shift"] + counts["beads_merge"],
        "shifted_pairs": counts["beads_shift"],
        "merged_pairs": counts["beads_merge"],
        "dropped_source_verses": counts["dropped_source_verses"],
        "dropped_target_verses": counts["dropped_target_verses"],
        "drops_by_reason": {k[len("dropped_"):]: v for k, v in sorted(counts.items())
                            if k.startswith("dropped_") and not k.endswith("_verses")},
        "books": per_book,
    }
    return AlignmentResult(pairs, report)


# --------------------------------------------------------------------------------------------
# Split and the whole build
# --------------------------------------------------------------------------------------------

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


def package_versions() -> dict[str, str]:
    """Debian package versions of the modules and mod2imp (``"unknown"`` where dpkg can't say)."""
    versions = {}
    for package in sorted(set(PACKAGES.values())):
        try:
            proc = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                                  capture_output=True, text=True, timeout=30)
            versions[package] = proc.stdout.strip() if proc.returncode == 0 else "not installed"
        except (OSError, subprocess.SubprocessError):
            versions[package] = "unknown"
    return versions


@dataclasses.dataclass
class BibleCorpus:
    """Pairs per split, the alignment report, and clean-up counts."""

    splits: dict[str, list[tuple[str, str]]]
    alignment_report: dict
    cleanup: dict
    packages: dict[str, str]


def load_books(source_text: str, target_text: str, stats: dict | None = None
               ) -> dict[str, tuple[dict[Key, str], dict[Key, str]]]:
    """Two mod2imp outputs -> ``{book: (source_verses, target_verses)}`` for shared books."""
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


def build_bible_corpus(params: AlignParams = AlignParams(), seed: int = 0) -> BibleCorpus:
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
