"""Step 2 of the Bible corpus: aligning the verses of the two Bibles.

RV1909 is keyed by KJV references, but its text follows the Hebrew/Spanish verse division in some
chapters, so key-aligned pairs are not always translations. :func:`align_books` learns a
:class:`~aiayn.pipeline.data.bible.lexicon.LexicalModel` on the key-aligned chapters, calibrates
the score threshold on deliberately shifted pairs (:func:`shifted_pairs`,
:func:`calibrate_threshold`) and aligns each book with :func:`align_verses`: confident chapters
are kept as keyed, runs of other chapters go through a banded dynamic program (``_align_block``).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from aiayn.pipeline.data.bible.extract import Key
from aiayn.pipeline.data.bible.lexicon import (
    Features,
    LexicalModel,
    features,
    join_features,
    tokenize,
)


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

    Key-aligned pairs of chapters that look fine (same verse keys, every score >= threshold and
    no pair beaten by a neighbouring shifted reading by more than ``params.margin``) are kept.
    Each run of other chapters is re-aligned as one block by a banded dynamic program
    (``_align_block``; see the package docstring). Every kept bead scores at least
    ``threshold``.
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


_UNREACHED = -1e18  # total of a DP state no path reaches


class _BlockScorer:
    """The verses of one block: which source and target items may share a bead, and bead scores.

    Items are indexed by their position in ``src_keys`` / ``tgt_keys``; scores are cached.
    """

    def __init__(self, src_keys: list[Key], tgt_keys: list[Key], fs: Mapping[Key, Features],
                 ft: Mapping[Key, Features], model: LexicalModel, band: int):
        union = {k: n for n, k in enumerate(sorted(set(src_keys) | set(tgt_keys)))}
        self.src_keys, self.tgt_keys = src_keys, tgt_keys
        self.ps = [union[k] for k in src_keys]  # each item's position among all keys
        self.pt = [union[k] for k in tgt_keys]
        self.band = band
        self._fs, self._ft, self._model = fs, ft, model
        self._cache: dict[tuple[int, int, int, int], float] = {}

    def near(self, a: int, b: int) -> bool:
        """Source item a and target item b may share a bead."""
        return abs(self.ps[a] - self.pt[b]) <= self.band

    def score(self, i0: int, i1: int, j0: int, j1: int) -> float:
        """Score of source items ``i0:i1`` joined against target items ``j0:j1``."""
        key = (i0, i1, j0, j1)
        if key not in self._cache:
            self._cache[key] = self._model.score_features(
                join_features([self._fs[k] for k in self.src_keys[i0:i1]]),
                join_features([self._ft[k] for k in self.tgt_keys[j0:j1]]))
        return self._cache[key]

    def columns(self, i: int) -> Iterable[int]:
        """The j of the states (i, j) worth visiting: those near the band, plus the borders
        (j = 0 and j = m), so that the end is always reachable."""
        n, m = len(self.ps), len(self.pt)
        if not 0 < i < n:
            return range(m + 1)
        width = 2 * self.band + 2
        lo = bisect.bisect_left(self.pt, self.ps[i - 1] - width)
        hi = bisect.bisect_right(self.pt, self.ps[i - 1] + width)
        return sorted({0, m} | set(range(lo + 1, hi + 1)))


def _align_block(src_keys: list[Key], tgt_keys: list[Key], source: Mapping[Key, str],
                 target: Mapping[Key, str], fs: Mapping[Key, Features],
                 ft: Mapping[Key, Features], model: LexicalModel, threshold: float,
                 params: AlignParams) -> tuple[list[Bead], list[dict], list[dict]]:
    """Banded monotone DP over 1-1, 2-1, 1-2, 1-0 and 0-1 beads.

    Maximises the sum over beads of ``score - threshold`` (plus ``same_key_bonus`` for a
    key-aligned 1-1 bead, minus ``merge_penalty`` for a 2-1 or 1-2 bead); skips add 0 and only
    beads scoring at least ``threshold`` are allowed.
    """
    scorer = _BlockScorer(src_keys, tgt_keys, fs, ft, model, params.band)
    back = _best_paths(scorer, threshold, params)
    return _read_path(_backtrace(back, len(src_keys), len(tgt_keys)), scorer, source, target,
                      params)


def _best_paths(scorer: _BlockScorer, threshold: float, params: AlignParams
                ) -> dict[tuple[int, int], tuple[int, int, float]]:
    """Fills the DP table; returns each reached state's best predecessor and bead score."""
    n, m = len(scorer.src_keys), len(scorer.tgt_keys)
    best = np.full((n + 1, m + 1), _UNREACHED)
    back: dict[tuple[int, int], tuple[int, int, float]] = {}
    best[0, 0] = 0.0
    for i in range(n + 1):
        for j in scorer.columns(i):
            if i == 0 and j == 0:
                continue
            cands = _transitions(best, i, j, scorer, threshold, params)
            if cands:
                total, pi, pj, s = max(cands, key=lambda c: c[0])
                best[i, j] = total
                back[(i, j)] = (pi, pj, s)
    return back


def _transitions(best: np.ndarray, i: int, j: int, scorer: _BlockScorer, threshold: float,
                 params: AlignParams) -> list[tuple[float, int, int, float]]:
    """The ways into state (i, j) as ``(total, previous i, previous j, bead score)``: skipping a
    source or a target item, or a 1-1, 2-1 or 1-2 bead within the band that clears the
    threshold."""
    cands: list[tuple[float, int, int, float]] = []
    if i >= 1 and best[i - 1, j] > _UNREACHED:
        cands.append((best[i - 1, j], i - 1, j, 0.0))
    if j >= 1 and best[i, j - 1] > _UNREACHED:
        cands.append((best[i, j - 1], i, j - 1, 0.0))
    if not (i >= 1 and j >= 1 and scorer.near(i - 1, j - 1)):
        return cands
    if best[i - 1, j - 1] > _UNREACHED:
        s = scorer.score(i - 1, i, j - 1, j)
        same_key = scorer.src_keys[i - 1] == scorer.tgt_keys[j - 1]
        bonus = params.same_key_bonus if same_key else 0.0
        if s >= threshold:
            cands.append((best[i - 1, j - 1] + s - threshold + bonus, i - 1, j - 1, s))
    for pi, pj in ((i - 2, j - 1), (i - 1, j - 2)):  # merges: 2-1, then 1-2
        if pi >= 0 and pj >= 0 and best[pi, pj] > _UNREACHED and scorer.near(pi, pj):
            s = scorer.score(pi, i, pj, j)
            if s >= threshold:
                cands.append((best[pi, pj] + s - threshold - params.merge_penalty, pi, pj, s))
    return cands


def _backtrace(back: Mapping[tuple[int, int], tuple[int, int, float]], n: int, m: int
               ) -> list[tuple[int, int, int, int, float]]:
    """The best path from (0, 0) to (n, m) as beads ``(i0, i1, j0, j1, score)``, in order."""
    i, j = n, m
    path = []
    while (i, j) != (0, 0):
        pi, pj, s = back[(i, j)]
        path.append((pi, i, pj, j, s))
        i, j = pi, pj
    return path[::-1]


def _read_path(path: Sequence[tuple[int, int, int, int, float]], scorer: _BlockScorer,
               source: Mapping[Key, str], target: Mapping[Key, str], params: AlignParams
               ) -> tuple[list[Bead], list[dict], list[dict]]:
    """The path's beads, the repairs among them, and the drops (skips, ambiguous 1-1 beads)."""
    beads: list[Bead] = []
    repairs: list[dict] = []
    drops: list[dict] = []
    for i0, i1, j0, j1, s in path:
        sk, tk = tuple(scorer.src_keys[i0:i1]), tuple(scorer.tgt_keys[j0:j1])
        one_to_one = len(sk) == len(tk) == 1
        if one_to_one and not _locally_best(i0, j0, s, scorer, params):
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


def _locally_best(i: int, j: int, s: float, scorer: _BlockScorer, params: AlignParams) -> bool:
    """True when pair (i, j) is not beaten by source i or target j with a neighbouring verse."""
    rivals = [scorer.score(i, i + 1, jj, jj + 1) for jj in (j - 1, j + 1)
              if 0 <= jj < len(scorer.tgt_keys)]
    rivals += [scorer.score(ii, ii + 1, j, j + 1) for ii in (i - 1, i + 1)
               if 0 <= ii < len(scorer.src_keys)]
    return all(s + params.margin >= r for r in rivals)


def shifted_pairs(books: Mapping[str, tuple[Mapping[Key, str], Mapping[Key, str]]],
                  model: LexicalModel, offsets: Sequence[int] = (1, 2),
                  min_identity: float = 0.6, max_samples: int = 6000,
                  seed: int = 0) -> list[tuple[str, str]]:
    """Known-wrong pairs for calibration: verses a and b = a + offset (in shared keys), crossed.

    Yields source a with target b and source b with target a, taken only where both key-aligned
    pairs (a, a) and (b, b) score at least ``min_identity`` (so the region is aligned and the
    shifted pairs are wrong) and verses a and b differ on both sides (word Jaccard < 0.5:
    repeated verses such as Numbers 7's offerings are not wrong pairs). At most ``max_samples``
    (a, b) candidates are drawn (seeded).
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
    """The score that at most ``1 - calibration_quantile`` of known-wrong pairs reach.

    Clipped to ``[min_threshold, max_threshold]`` (so past ``max_threshold`` more wrong pairs may
    reach it); ``min_threshold`` when there are no wrong pairs.
    """
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
