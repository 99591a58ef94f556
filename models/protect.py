"""Spans the model cannot translate, passed through unchanged: placeholders, options, numbers...

A model trained on ordinary sentences has never seen ``%d``, ``{name}``, ``--verbose``,
``<b>``, ``3.14``, ``https://example.org/x?y=1`` or ``someone@example.org`` (the corpus holds no
digits and none of ``{}<>%``): fed to it, they come back as invented words. Translation
therefore splits each input into *pieces* at the spans of :data:`DEFAULT_PATTERN` (one regular
expression, valid for RE2, the engine of the in-graph ops, and for Python's ``re``), translates
only the pieces between spans, and puts every span back where it was, byte for byte.

The rules, written once here for the exported graph (:func:`split_protected`,
:func:`join_translations`) and for Python (:func:`split_protected_text`, :func:`join_text`,
used by the CTranslate2 engine):

* **Search.** The pattern is searched in ``" " + text`` (so an option at the very start is
  preceded by whitespace like any other), left to right, each search starting where the last
  span ended, as tensorflow-text's ``RegexSplitWithOffsets`` does (``RE2::FindAndConsume``):
  there, ``^`` and ``\\b`` see the start of the remaining text as the start of the text, so a
  custom pattern should not use anchors or word boundaries. The default pattern has none: an
  option's preceding whitespace is part of its span (RE2 has no look-behind), which keeps
  ``well-known`` and ``e-mail`` (a letter before the dash) out.
* **Pieces.** A row is cut into the spans (``protected``) and the text between them; pieces are
  non-empty substrings of the input that, concatenated, give the input back.
* **What is translated.** A piece that is not protected and holds a letter (``\\pL``). One
  without any letter (``": "``, ``" ("``, whitespace) is passed through unchanged too.
* **Rows without a span** are not split at all: their one piece is the whole input, translated
  exactly as it is without protection (same featuriser input, same ids, same scores). So is a
  row the split cannot cover byte for byte (RegexSplitWithOffsets stops at a NUL byte): it is
  never cut short.
* **Joining** (split rows only): a translated piece keeps the whitespace it had at its ends
  around its translation (``" to print "`` -> ``" " + tr(" to print ") + " "``), passed-through
  pieces are copied, all are concatenated in order, and the outer whitespace of the result is
  stripped. Whitespace means ``\\t \\n \\f \\r`` and the Unicode separators (``\\p{Z}``, the
  space included), as in the tokenizer's visible-character count.
* **n-best and scores** (the callers): hypothesis k of a row joins hypothesis k of its pieces;
  its score is the sum of theirs (:func:`scatter_to_rows`), and its unknown fraction is over
  the translated pieces (:func:`rows_unknown_fraction`).

Example::

    split_protected_text("Use --verbose to print %d more lines.")
    # TextSegments(pieces=['Use', ' --verbose', ' to print ', '%d', ' more lines.'],
    #              protected=[False, True, False, True, False],
    #              translate=[True, False, True, False, True], split=True)

This module imports TensorFlow only inside the graph functions, so the Python half serves the
CTranslate2 engine, which needs no TensorFlow.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, NamedTuple

# -- the default pattern -----------------------------------------------------------------------
# Pieces of one regular expression, in priority order (at one start position the first branch
# that matches wins: an e-mail address is not cut at its digits). ASCII classes only, no
# \d \w \s \b (RE2 and Python's `re` read those differently for non-ASCII text), no
# look-around (RE2 has none), and no branch matches the empty string.
_WS = r"\t\n\f\r "
_URL = (r"(?:[A-Za-z][A-Za-z0-9+.-]*://|www\.)"
        r"[^" + _WS + r"<>\"]*[^" + _WS + r"<>\".,;:!?'()\[\]{}]")
_EMAIL = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+"
_TAG = (r"</?[A-Za-z][A-Za-z0-9:-]*"
        r"(?:[" + _WS + r"]+[A-Za-z_:][A-Za-z0-9_.:-]*"
        r"(?:[" + _WS + r"]*=[" + _WS + r"]*(?:\"[^\"<>]*\"|'[^'<>]*'|[^" + _WS
        + r"<>\"'=]+))?)*[" + _WS + r"]*/?>")
_ENTITY = r"&(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#[xX][0-9A-Fa-f]+);"
# printf conversions (%s %d %5.2f %-10s %lld %%) and Python's %(name)s; no space flag, so that
# "100 % sure" keeps its words.
_PRINTF = (r"%(?:\([A-Za-z_][A-Za-z0-9_]*\))?(?:[0-9]+\$)?[-+#0']*(?:[0-9]+|\*)?"
           r"(?:\.(?:[0-9]+|\*))?(?:hh|ll|[hlLqjzt])?[diouxXeEfFgGaAcspn%]")
# {0} {name} {} {0:.2f} {name!r} {user.name} {items[0]}, ${var}, {{name}} (templates).
_BRACE = (r"\{\{[^{}]*\}\}"
          r"|\$?\{[A-Za-z0-9_.\[\]]*(?:![A-Za-z])?(?::[^{}" + _WS + r"]*)?\}")
# An option: preceded by whitespace, an opening bracket or a quote (kept inside the span);
# --long-opt, --opt=value, -v, -rf. "well-known" and "e-mail" have a letter before the dash.
_OPTION = (r"[" + _WS + r"(\[\"'`]--?[A-Za-z][A-Za-z0-9_-]*"
           r"(?:=[A-Za-z0-9_.,:/+-]+)?")
# Numbers and words holding a digit, with their hyphenated parts: 3, -2, 3.14, 1,000, 10:30,
# 2.0.1, 50%, MP3, 2nd, COVID-19, 3-year-old, 2024-01-05.
_NUMBER = (r"[-+]?(?:[A-Za-z_]+-)*[A-Za-z_]*[0-9][A-Za-z0-9_]*"
           r"(?:[.,:][0-9][A-Za-z0-9_]*|-[A-Za-z0-9_]+)*%?")

DEFAULT_PATTERN = "|".join([_URL, _EMAIL, _TAG, _ENTITY, _PRINTF, _BRACE, _OPTION, _NUMBER])
"""The spans passed through unchanged (module docstring): URLs, e-mail addresses, markup tags
and entities, printf conversions, brace placeholders, command-line options, numbers."""

# `\pL` for RE2; Python: str.isalpha() is exactly the L* categories.
_LETTER_RE2 = r"(?s).*\pL.*"
# Whitespace at the ends of a piece, and the outer whitespace stripped from a joined row.
_SPACE_RE2 = r"[\t\n\f\r\p{Z}]"


class PatternError(ValueError):
    """A protection pattern that RE2 or Python cannot use as one."""


def check_pattern(pattern: str, re2: bool = True) -> str:
    """Checks a protection pattern; returns it. ``""`` (protection off) is valid.

    Args:
      pattern: the regular expression.
      re2: also compile it with RE2 (needs TensorFlow; the graph ops use RE2).

    Raises:
      PatternError: it is not a string, does not compile in Python's ``re`` or in RE2, or it
        matches the empty string (a split would never advance).
    """
    if not isinstance(pattern, str):
        raise PatternError(f"The protection pattern must be a string; got "
                           f"{type(pattern).__name__}.")
    if not pattern:
        return pattern
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise PatternError(f"The protection pattern is not a valid regular expression "
                           f"({err}): {pattern!r}") from None
    probe = " a-b 1 %d {x} <b> e@x.y --v\n"
    if any(m.start() == m.end() for m in compiled.finditer(probe)) or compiled.match(""):
        raise PatternError(f"The protection pattern matches the empty string; every "
                           f"alternative must match at least one character: {pattern!r}")
    if re2:
        import tensorflow as tf

        with tf.init_scope():
            try:
                tf.strings.regex_full_match(tf.constant([""]), pattern)
            except tf.errors.InvalidArgumentError as err:
                raise PatternError(f"RE2 (the exported graph's regex engine) rejects the "
                                   f"protection pattern: {err.message.splitlines()[0]}"
                                   ) from None
    return pattern


# -- Python ------------------------------------------------------------------------------------
class TextSegments(NamedTuple):
    """One text cut at its protected spans (:func:`split_protected_text`).

    Attributes:
      pieces: the pieces, in order; ``"".join(pieces)`` is the text.
      protected: per piece, whether it is a span of the pattern.
      translate: per piece, whether the model translates it.
      split: False when the text is one piece translated as a whole (no span, or a text the
        split could not cover); then ``pieces == [text]`` and ``translate == [True]``.
    """

    pieces: list[str]
    protected: list[bool]
    translate: list[bool]
    split: bool


def has_letter(text: str) -> bool:
    """Whether ``text`` holds a letter (Unicode category L*, RE2's ``\\pL``)."""
    return any(c.isalpha() for c in text)


def is_space(c: str) -> bool:
    """RE2's ``[\\t\\n\\f\\r\\p{Z}]``: ASCII whitespace but \\v, and Unicode separators."""
    return c in "\t\n\f\r " or unicodedata.category(c).startswith("Z")


def strip_space(text: str) -> str:
    """``text`` without the whitespace (:func:`is_space`) at its ends."""
    start, end = 0, len(text)
    while start < end and is_space(text[start]):
        start += 1
    while end > start and is_space(text[end - 1]):
        end -= 1
    return text[start:end]


def _regex_split(text: str, compiled: re.Pattern) -> list[tuple[int, int]]:
    """``(begin, end)`` of the pieces tensorflow-text's RegexSplitWithOffsets cuts ``text``
    into: each search runs on the remaining text as if it were the whole text; a match is kept
    as a piece when it full-matches the pattern (else it is dropped); no empty pieces; the
    split ends at the first NUL character (the kernel reads a C string)."""
    stop = text.find("\0")
    end = len(text) if stop < 0 else stop
    out, last, pos = [], 0, 0
    while pos <= end:
        match = compiled.search(text[pos:end])
        if match is None:
            break
        begin, after = pos + match.start(), pos + match.end()
        if begin > last:
            out.append((last, begin))
        if after > begin and compiled.fullmatch(text[begin:after]):
            out.append((begin, after))
        last = pos = after if after > pos else pos + 1
    if last < end:
        out.append((last, end))
    return out


def split_protected_text(text: str, pattern: str = DEFAULT_PATTERN) -> TextSegments:
    """Python twin of :func:`split_protected` for one text (the rules: module docstring).

    Args:
      text: the input.
      pattern: the protection pattern; ``""`` keeps the text whole.

    Returns:
      :class:`TextSegments`.
    """
    whole = TextSegments([text], [False], [True], False)
    if not pattern:
        return whole
    padded = " " + text
    compiled = re.compile(pattern)
    pieces, protected = [], []
    for begin, end in _regex_split(padded, compiled):
        span = compiled.fullmatch(padded[begin:end]) is not None  # as the graph decides
        begin, end = max(begin - 1, 0), end - 1  # offsets into `text`
        if end > begin:
            pieces.append(text[begin:end])
            protected.append(span)
    if not any(protected) or sum(len(p) for p in pieces) != len(text):
        return whole
    translate = [not p and has_letter(t) for t, p in zip(pieces, protected)]
    return TextSegments(pieces, protected, translate, True)


def join_text(segments: TextSegments, translations: list[str]) -> str:
    """Python twin of :func:`join_translations` for one text.

    Args:
      segments: from :func:`split_protected_text`.
      translations: one per piece with ``translate`` True, in order.

    Returns:
      The translated text: as is for an unsplit text, else the pieces joined and stripped.
    """
    found = iter(translations)
    if not segments.split:
        return next(found)
    out = []
    for piece, translate in zip(segments.pieces, segments.translate):
        if not translate:
            out.append(piece)
            continue
        lead, trail = edge_space_text(piece)
        out.append(lead + next(found) + trail)
    return strip_space("".join(out))


def edge_space_text(text: str) -> tuple[str, str]:
    """The whitespace (:func:`is_space`) at the start and at the end of ``text``."""
    core = strip_space(text)
    if not core:
        return text, ""
    lead = text.index(core)
    return text[:lead], text[lead + len(core):]


# -- TensorFlow (the exported graph) -----------------------------------------------------------
class Segments(NamedTuple):
    """What :func:`split_protected` returns.

    Attributes:
      pieces: `tf.RaggedTensor` string `(batch, (pieces))`; row ``i`` concatenated is input
        ``i`` (an empty input has one piece, ``""``).
      protected: ragged bool `(batch, (pieces))`: a span of the pattern.
      translate: ragged bool `(batch, (pieces))`: translated by the model.
      split: bool `(batch,)`: False where the row is its input whole (no span, or not covered).
    """

    pieces: Any
    protected: Any
    translate: Any
    split: Any


def split_protected(strings: Any, pattern: str = DEFAULT_PATTERN) -> Segments:
    """Cuts each input at its protected spans, in-graph (the rules: module docstring).

    Ops: tensorflow-text's ``RegexSplitWithOffsets`` (linked into the stock
    ``tensorflow_model_server`` with the SentencePiece ops) and core string ops.

    Args:
      strings: `tf.string` of shape `(batch,)`.
      pattern: the protection pattern (non-empty; RE2 syntax, see :func:`check_pattern`).

    Returns:
      :class:`Segments`.

    Raises:
      tf.errors.InvalidArgumentError: an input is not valid UTF-8 (at run time).

    Example:
      >>> split_protected(tf.constant(["Print %d lines.", "Jesus wept."])).pieces.to_list()
      [[b'Print ', b'%d', b' lines.'], [b'Jesus wept.']]
    """
    import tensorflow as tf
    import tensorflow_text as tf_text

    from aiayn.models.tokenizer import _checked_utf8

    # Byte offsets cut UTF-8 text: invalid input is refused here, as the featuriser refuses it
    # (a passed-through piece never reaches the featuriser's own check).
    strings = _checked_utf8(tf.convert_to_tensor(strings, tf.string))  # (batch,)
    padded = tf.strings.join([" ", strings])  # (batch,): an option at the start has its space
    cut, begins, ends = tf_text.regex_split_with_offsets(padded, pattern, pattern)
    # (batch, (cut)) pieces of `padded`; kept delimiters full-match the pattern.
    is_span = tf.strings.regex_full_match(cut.flat_values, pattern)  # (cut,)
    rows = cut.value_rowids()  # (cut,) int64
    begin = tf.maximum(begins.flat_values - 1, 0)  # (cut,) byte offsets into `strings`
    size = ends.flat_values - 1 - begin  # (cut,) 0 only for the added space alone
    nonempty = size > 0
    pieces = tf.strings.substr(tf.gather(strings, tf.boolean_mask(rows, nonempty)),
                               tf.cast(tf.boolean_mask(begin, nonempty), tf.int32),
                               tf.cast(tf.boolean_mask(size, nonempty), tf.int32))
    batch = tf.shape(strings, out_type=tf.int64)[0]
    kept_rows = tf.boolean_mask(rows, nonempty)  # (pieces,)
    pieces = tf.RaggedTensor.from_value_rowids(pieces, kept_rows, nrows=batch)
    is_span = tf.RaggedTensor.from_value_rowids(tf.boolean_mask(is_span, nonempty), kept_rows,
                                                nrows=batch)
    covered = tf.equal(tf.reduce_sum(tf.strings.length(pieces), axis=1),
                       tf.strings.length(strings))  # (batch,): no NUL, no dropped delimiter
    split = tf.logical_and(tf.reduce_any(is_span, axis=1), covered)  # (batch,)
    # Rows that are not split: their one piece is the input, translated whole.
    keep = _broadcast_rows(split, pieces)
    whole = tf.logical_not(split)[:, None]  # (batch, 1)
    pieces = tf.concat([tf.ragged.boolean_mask(pieces, keep),
                        tf.ragged.boolean_mask(strings[:, None], whole)], axis=1)
    protected = tf.concat([tf.ragged.boolean_mask(is_span, keep),
                           tf.ragged.boolean_mask(tf.zeros_like(whole), whole)], axis=1)
    letter = tf.ragged.map_flat_values(tf.strings.regex_full_match, pieces, _LETTER_RE2)
    split_piece = tf.repeat(split, pieces.row_lengths())  # (pieces,)
    translate = pieces.with_flat_values(tf.logical_or(
        tf.logical_not(split_piece),
        tf.logical_and(tf.logical_not(protected.flat_values), letter.flat_values)))
    return Segments(pieces=pieces, protected=protected, translate=translate, split=split)


def _broadcast_rows(values: Any, like: Any) -> Any:
    """`(batch,)` values repeated over the pieces of each row of ragged ``like``."""
    import tensorflow as tf

    return like.with_flat_values(tf.repeat(values, like.row_lengths()))


def edge_space(pieces: Any) -> tuple[Any, Any]:
    """The whitespace at the start and at the end of each string (`(n,)` each), in-graph."""
    import tensorflow as tf

    length = tf.strings.length(pieces)  # (n,) bytes
    lead = length - tf.strings.length(
        tf.strings.regex_replace(pieces, f"^{_SPACE_RE2}+", "", replace_global=False))
    trail = length - tf.strings.length(
        tf.strings.regex_replace(pieces, f"{_SPACE_RE2}+$", "", replace_global=False))
    return (tf.strings.substr(pieces, tf.zeros_like(lead), lead),
            tf.strings.substr(pieces, length - trail, trail))


def join_translations(segments: Segments, translations: Any) -> Any:
    """Puts translations back in place of the translated pieces (the rules: module docstring).

    Args:
      segments: from :func:`split_protected`.
      translations: `tf.string` `(translated, k)`: ``k`` hypotheses of each piece whose
        ``translate`` is True, in row-major piece order.

    Returns:
      `tf.string` `(batch, k)`: hypothesis ``j`` of a row is the join of hypothesis ``j`` of its
      pieces (an unsplit row: its piece's translation, untouched).
    """
    import tensorflow as tf

    pieces = segments.pieces.flat_values  # (pieces,)
    translate = segments.translate.flat_values  # (pieces,)
    rows = segments.pieces.value_rowids()  # (pieces,)
    split_piece = tf.gather(segments.split, rows)  # (pieces,)
    count = tf.shape(translations)[0]
    # Piece -> its row in `translations`; passed-through pieces point at a blank extra row.
    index = tf.where(translate, tf.cumsum(tf.cast(translate, tf.int32)) - 1, count)  # (pieces,)
    padded = tf.concat([translations, tf.fill([1, tf.shape(translations)[1]], "")], 0)
    found = tf.gather(padded, index)  # (pieces, k)
    lead, trail = edge_space(pieces)  # (pieces,) each
    lead = tf.where(split_piece, lead, "")
    trail = tf.where(split_piece, trail, "")
    shape = tf.shape(found)  # StringJoin does not broadcast
    placed = tf.where(translate[:, None],
                      tf.strings.join([tf.broadcast_to(lead[:, None], shape), found,
                                       tf.broadcast_to(trail[:, None], shape)]),
                      pieces[:, None])  # (pieces, k)
    batch = tf.shape(segments.split)[0]
    joined = tf.strings.unsorted_segment_join(placed, rows, batch)  # (batch, k), in order
    stripped = tf.strings.regex_replace(joined, f"^{_SPACE_RE2}+|{_SPACE_RE2}+$", "")
    return tf.where(segments.split[:, None], stripped, joined)


def scatter_to_rows(segments: Segments, values: Any, reduce: str = "sum") -> Any:
    """Per-row sums (``"sum"``) or any (``"any"``) of per-translated-piece ``values``.

    Args:
      segments: from :func:`split_protected`.
      values: `(translated, ...)` float (sum) or bool (any), one row per translated piece.

    Returns:
      `(batch, ...)`: 0 / False for a row without translated pieces.
    """
    import tensorflow as tf

    rows = tf.boolean_mask(segments.pieces.value_rowids(),
                           segments.translate.flat_values)  # (translated,)
    batch = tf.shape(segments.split, out_type=tf.int64)[0]
    if reduce == "any":
        hits = tf.math.unsorted_segment_max(tf.cast(values, tf.int32), rows, batch)
        return hits > 0
    return tf.math.unsorted_segment_sum(values, rows, batch)


def rows_unknown_fraction(segments: Segments, source: Any, unknown: Any) -> Any:
    """Per input, the share of unknown characters over its translated pieces.

    The featuriser gives each piece's share (``SourceFeatures.unknown_fraction``); back to a
    count of characters (exact after rounding), summed over an input's translated pieces and
    divided by their visible characters: protected and passed-through text does not count. An
    unsplit input keeps its one piece's share untouched.

    Args:
      segments: from :func:`split_protected`.
      source: `tf.string` `(translated,)`, the translated pieces in order.
      unknown: float32 `(translated,)`, their shares.

    Returns:
      float32 `(batch,)` in [0, 1]; 0 for an input with no visible translated character.
    """
    import tensorflow as tf

    from aiayn.models.tokenizer import visible_chars

    visible = tf.cast(visible_chars(source), tf.float32)  # (translated,)
    total = scatter_to_rows(segments, visible)  # (batch,)
    fraction = scatter_to_rows(segments, tf.round(unknown * visible)) / tf.maximum(total, 1.0)
    fraction = tf.where(total > 0, tf.minimum(fraction, 1.0), 0.0)
    # An unsplit input has one piece, translated: its index among the translated pieces.
    translate = segments.translate.flat_values  # (pieces,)
    first = tf.cumsum(tf.cast(translate, tf.int32), exclusive=True)  # (pieces,)
    own = tf.gather(tf.concat([unknown, [0.0]], 0),
                    tf.gather(first, segments.pieces.row_starts()))  # (batch,)
    return tf.where(segments.split, fraction, own)
