"""sacreBLEU settings chosen by target language: THE choice for dev BLEU, evaluation and the card.

BLEU counts word n-grams, so its tokenizer must find the words of the target language.
sacreBLEU's default, ``13a``, splits on spaces and punctuation: a Chinese or Japanese sentence
(no spaces) becomes one "word", and BLEU for an en->zh model would be meaningless. So:

==================  =========================================================================
target language     BLEU tokenizer (``train.bleu_tokenize=auto``)
==================  =========================================================================
zh                  ``zh``: each Chinese character a token, other text as 13a
ja                  ``ja-mecab`` (MeCab, IPA dictionary; ``pip install 'aiayn[ja]'``); without
                    it ``char`` (every character a token), and a note says so
th, lo, km, my      ``char`` (no spaces between words; sacreBLEU has no segmenter for them)
anything else       ``13a`` (sacreBLEU's default; Korean is written with spaces)
==================  =========================================================================

chrF needs no tokenizer (character n-grams, spaces ignored): 6-grams, and no word n-grams
(``nw:0``) for every language, since word n-grams (chrF++) would need words, which Chinese and
Japanese text does not mark. ``train.bleu_tokenize`` overrides the choice; the signatures
(``tok:zh``, ``tok:ja-mecab-0.996-IPA``, ...) name what was used.

Example::

    settings = metric_settings("zh")          # or metric_settings_for(cfg)
    score_corpus(["我爱你"], ["我爱你们"], settings)["bleu_signature"]   # '...|tok:zh|...'
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from aiayn.pipeline.data.languages import base_language
from aiayn.pipeline.errors import UserInputError

# Written without spaces between words, and without a sacreBLEU segmenter: character BLEU.
UNSPACED_LANGUAGES = frozenset({"th", "lo", "km", "my"})
CHRF_CHAR_ORDER = 6
CHRF_WORD_ORDER = 0


@dataclasses.dataclass(frozen=True)
class MetricSettings:
    """How BLEU and chrF are computed for one target language.

    Attributes:
      target_lang: the language code the choice was made for.
      bleu_tokenize: sacreBLEU's ``tokenize`` for BLEU (``13a``, ``zh``, ``ja-mecab``, ``char``,
        ...).
      chrf_char_order, chrf_word_order: chrF's n-gram orders.
      reason: why this tokenizer, in a few words (the model card shows it).
    """

    target_lang: str
    bleu_tokenize: str
    reason: str
    chrf_char_order: int = CHRF_CHAR_ORDER
    chrf_word_order: int = CHRF_WORD_ORDER

    def bleu(self):
        """A ``sacrebleu.metrics.BLEU`` with these settings."""
        import sacrebleu

        return sacrebleu.metrics.BLEU(tokenize=self.bleu_tokenize)

    def chrf(self):
        """A ``sacrebleu.metrics.CHRF`` with these settings."""
        import sacrebleu

        return sacrebleu.metrics.CHRF(char_order=self.chrf_char_order,
                                      word_order=self.chrf_word_order)

    def describe(self) -> str:
        """One line for logs and the model card."""
        return (f"BLEU tokenizer `{self.bleu_tokenize}` ({self.reason}); chrF character "
                f"{self.chrf_char_order}-grams, word {self.chrf_word_order}-grams")


def _segmenter_error(tokenize: str) -> str | None:
    """Why sacreBLEU's ``tokenize`` cannot run here, or None when it can."""
    if tokenize not in ("ja-mecab", "ko-mecab"):
        return None
    import sacrebleu

    try:
        sacrebleu.metrics.BLEU(tokenize=tokenize)
    except (ImportError, RuntimeError, AssertionError) as err:  # sacreBLEU's own checks
        return " ".join(str(err).split()) or type(err).__name__
    return None


@functools.cache
def segmenter_available(tokenize: str) -> bool:
    """Whether sacreBLEU's ``tokenize`` runs here (``ja-mecab``/``ko-mecab`` need MeCab)."""
    return _segmenter_error(tokenize) is None


def metric_settings(target_lang: str, override: str = "auto") -> MetricSettings:
    """THE choice of sacreBLEU settings for a target language (module docstring's table).

    Args:
      target_lang: the target language code (``data.target_lang``), e.g. ``zh``, ``ja-JP``.
      override: ``auto``, or a sacreBLEU tokenizer name (``train.bleu_tokenize``).

    Returns:
      :class:`MetricSettings`.

    Raises:
      UserInputError: ``override`` names ``ja-mecab`` or ``ko-mecab`` and its dependencies are
        not installed (the message says which package to install).
    """
    if override and override != "auto":
        problem = _segmenter_error(override)
        if problem:
            extra = "aiayn[ja]" if override == "ja-mecab" else "sacrebleu[ko]"
            raise UserInputError(
                f"train.bleu_tokenize={override} cannot run here ({problem}). Install it with "
                f"`pip install '{extra}'`, or set train.bleu_tokenize=char (or auto).")
        return MetricSettings(target_lang, override, f"set by train.bleu_tokenize={override}")
    lang = base_language(target_lang)
    if lang == "zh":
        return MetricSettings(target_lang, "zh",
                              "Chinese target: each Chinese character is a token")
    if lang == "ja":
        if segmenter_available("ja-mecab"):
            return MetricSettings(target_lang, "ja-mecab",
                                  "Japanese target: MeCab word segmentation")
        return MetricSettings(target_lang, "char",
                              "Japanese target; MeCab is not installed (pip install "
                              "'aiayn[ja]' for ja-mecab), so each character is a token")
    if lang in UNSPACED_LANGUAGES:
        return MetricSettings(target_lang, "char",
                              f"{lang} target: no spaces between words, each character is a "
                              "token")
    return MetricSettings(target_lang, "13a", "sacreBLEU's default for space-delimited text")


def metric_settings_for(cfg: Any) -> MetricSettings:
    """:func:`metric_settings` for a run: ``cfg.data.target_lang``, ``cfg.train.bleu_tokenize``.
    """
    return metric_settings(cfg.data.target_lang, cfg.train.bleu_tokenize)


def score_corpus(hypotheses: Sequence[str], references: Sequence[str],
                 settings: MetricSettings) -> dict[str, Any]:
    """Corpus BLEU and chrF with ``settings``: ``bleu``, ``chrf`` (rounded to 2 decimals),
    ``bleu_signature``, ``chrf_signature``, ``bleu_tokenize`` and ``bleu_detail``."""
    bleu, chrf = settings.bleu(), settings.chrf()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return {"bleu": round(float(b.score), 2), "chrf": round(float(c.score), 2),
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()),
            "bleu_tokenize": settings.bleu_tokenize, "bleu_detail": str(b)}


def length_by_reference(hypotheses: Sequence[str], references: Sequence[str],
                        settings: MetricSettings, groups: int = 5) -> list[dict[str, Any]]:
    """The output's length against the reference's, for the shortest to the longest references.

    BLEU's brevity penalty sees only the corpus's total length; a model that drops clauses of
    long sentences and pads short ones can look level. The sentences, ordered by the length of
    their reference (BLEU's tokens, ``settings.bleu_tokenize``), are cut into ``groups`` groups
    of (nearly) equal size; each says its range of reference tokens, its number of sentences and
    its hypotheses' and references' tokens (``hyp_len``, ``ref_len``: the groups add up to
    sacreBLEU's figures for the corpus) and ``length_ratio``, the one over the other.

    Returns:
      One dict a group, shortest references first: ``reference_tokens`` ([fewest, most]),
      ``sentences``, ``hyp_len``, ``ref_len``, ``length_ratio`` (3 decimals). Empty when there
      are no sentences.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references.")
    tokenizer = settings.bleu().tokenizer
    lengths = sorted(((len(tokenizer(r.rstrip()).split()), len(tokenizer(h.rstrip()).split()))
                      for h, r in zip(hypotheses, references)))
    n = len(lengths)
    cuts = sorted({round(i * n / groups) for i in range(groups + 1)})
    rows = []
    for lo, hi in zip(cuts, cuts[1:]):
        group = lengths[lo:hi]
        ref_len, hyp_len = sum(r for r, _ in group), sum(h for _, h in group)
        rows.append({"reference_tokens": [group[0][0], group[-1][0]], "sentences": len(group),
                     "hyp_len": hyp_len, "ref_len": ref_len,
                     "length_ratio": round(hyp_len / max(ref_len, 1), 3)})
    return rows
