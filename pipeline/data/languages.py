"""What the pipeline needs to know of languages and scripts, in one place.

- :func:`weighted_length`: the length unit of the corpus' length-ratio check. Characters are
  counted in Latin-letter equivalents, so that a sentence and its translation come out about
  equally long whatever their scripts: a Chinese character carries about as much as three to
  four Latin letters ("今天天气很好" / "The weather is very nice today.": 6 against 31 plain
  characters, 21 against 31 weighted). Raw character counts made real Chinese-English pairs
  look misaligned.
- :func:`base_language`: ``zh-Hans``, ``zh_TW`` and ``ZH`` are all ``zh``.
- :func:`default_character_coverage`: SentencePiece's recommended coverage, 0.9995 for the
  rich character sets of Chinese, Japanese and Korean and 1.0 otherwise.

Example::

    weighted_length("我爱你")             # 10.5 (3 Han characters x 3.5)
    base_language("zh-Hant-TW")           # "zh"
    default_character_coverage("zh", "en")  # 0.9995
"""

from __future__ import annotations

import bisect

# Latin letters per character, by script (about the ratio of character counts of translations
# between English and each script). Everything not listed counts 1: Latin, Cyrillic, Greek,
# Arabic, Hebrew, Devanagari..., digits, punctuation (CJK punctuation included) and spaces.
SCRIPT_WEIGHTS = {"Han": 3.5, "Hangul": 2.5, "Kana": 2.0}
# (first, last, script) code point ranges, sorted.
_RANGES = sorted([
    (0x1100, 0x11FF, "Hangul"),   # Hangul Jamo
    (0x2E80, 0x2FDF, "Han"),      # CJK radicals, Kangxi radicals
    (0x3005, 0x3007, "Han"),      # 々 〆 〇
    (0x3040, 0x309F, "Kana"),     # Hiragana
    (0x30A0, 0x30FF, "Kana"),     # Katakana
    (0x3130, 0x318F, "Hangul"),   # Hangul compatibility Jamo
    (0x31F0, 0x31FF, "Kana"),     # Katakana phonetic extensions
    (0x3400, 0x4DBF, "Han"),      # CJK Extension A
    (0x4E00, 0x9FFF, "Han"),      # CJK Unified Ideographs
    (0xAC00, 0xD7AF, "Hangul"),   # Hangul syllables
    (0xF900, 0xFAFF, "Han"),      # CJK compatibility ideographs
    (0xFF66, 0xFF9F, "Kana"),     # half-width Katakana
    (0x20000, 0x3134F, "Han"),    # CJK Extensions B-G
])
_STARTS = [first for first, _, _ in _RANGES]
LENGTH_UNIT = ("characters weighted by script (Latin-letter equivalents: "
               + ", ".join(f"{name} {weight:g}" for name, weight in SCRIPT_WEIGHTS.items())
               + ", any other character 1)")

# Languages whose writing uses thousands of distinct characters.
RICH_CHARACTER_SET = frozenset({"zh", "ja", "ko"})


def script_weight(char: str) -> float:
    """Latin letters one character stands for (:data:`SCRIPT_WEIGHTS`; 1 for other scripts)."""
    point = ord(char)
    i = bisect.bisect_right(_STARTS, point) - 1
    if i >= 0 and point <= _RANGES[i][1]:
        return SCRIPT_WEIGHTS[_RANGES[i][2]]
    return 1.0


def weighted_length(text: str) -> float:
    """The length of ``text`` in Latin-letter equivalents (the length-ratio check's unit).

    Example:
      >>> weighted_length("I love you"), weighted_length("我爱你")
      (10.0, 10.5)
    """
    if text.isascii():
        return float(len(text))
    return float(sum(script_weight(c) for c in text))


def base_language(code: str) -> str:
    """The language subtag of a code, lower case: ``zh-Hans`` -> ``zh``, ``sr@latin`` -> ``sr``.
    """
    for sep in ("-", "_", "@", "."):
        code = code.split(sep, 1)[0]
    return code.lower()


def default_character_coverage(source_lang: str, target_lang: str) -> float:
    """SentencePiece's recommended ``character_coverage`` for a language pair.

    0.9995 when either side is Chinese, Japanese or Korean (their rarest characters become
    ``<unk>`` instead of taking a piece each, or failing a small ``vocab_size``), else 1.0
    (every character of the corpus gets a piece).
    """
    langs = {base_language(source_lang), base_language(target_lang)}
    return 0.9995 if langs & RICH_CHARACTER_SET else 1.0
