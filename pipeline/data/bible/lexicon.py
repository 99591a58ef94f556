"""The verse-pair score of the aligner: a translation table learned from the data itself.

:class:`LexicalModel` learns, from roughly aligned pairs, the likeliest translations of every word
(Dice association) and scores a source/target text pair by IDF-weighted two-way coverage times a
length-ratio factor. :func:`features` and :func:`join_features` are what the aligner precomputes
per verse and per merged verses.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

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
    length-ratio factor. A word of four or more letters without translations (too rare: mostly
    names) counts when a word of four or more letters on the other side starts with the same
    three letters, accents removed. About 0 for unrelated texts and 0.5-0.9 for translations.
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
