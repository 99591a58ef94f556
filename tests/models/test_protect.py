"""The protected-span pattern and the split (aiayn.models.protect): what passes through
untranslated, the in-graph split's shapes and values, and its Python twin (the CTranslate2
engine's) cutting every text exactly as the graph does."""

from __future__ import annotations

import pytest

from aiayn.models import protect

# Strings that are one whole protected span.
SPANS = [
    "%s", "%d", "%5.2f", "%-10s", "%%", "%lld", "%(name)s", "%1$s",
    "{0}", "{name}", "{}", "{0:.2f}", "{name!r}", "{user.name}", "{items[0]}", "${HOME}",
    "{{name}}",
    "--verbose", "-v", "-rf", "--log-level=debug", "--max-tokens",
    "<b>", "</b>", "<br/>", "<br />", '<a href="https://example.org/x">', "<img src='a.png' alt=x>",
    "&amp;", "&#39;", "&#x27;",
    "3", "3.14", "1,000", "-2", "+7", "10:30", "2.0.1", "50%", "MP3", "2nd", "COVID-19",
    "3-year-old", "2024-01-05",
    "https://example.org/x?y=1", "http://a.b/c#d", "ftp://files.example.org/a.txt",
    "www.example.org/page", "john.doe@example.org", "a+b@mail.example.co.uk",
]

# Strings in which nothing is protected.
PLAIN = [
    "well-known", "e-mail", "In the beginning God created the heavens and the earth.",
    "Peace be with you, my friend.", "A state-of-the-art method.", "a < b > c",
    "Señor, ¿qué es la verdad?", "我爱你", "x - y", "Use -- here", "R&D and AT&T",
    "the {braces are} prose", "Hello.", "", "   ", "a % b", "- v", "--", "<>",
]


def _spans(text, pattern=protect.DEFAULT_PATTERN):
    seg = protect.split_protected_text(text, pattern)
    return [p for p, prot in zip(seg.pieces, seg.protected) if prot]


@pytest.mark.parametrize("span", SPANS)
def test_a_span_is_protected_whole(span):
    assert _spans(span) == [span]
    # ... also inside a sentence, where options need the whitespace before them.
    assert [s.strip() for s in _spans(f"See {span} here.")] == [span]


@pytest.mark.parametrize("text", PLAIN)
def test_ordinary_text_is_not_protected(text):
    seg = protect.split_protected_text(text)
    assert seg == protect.TextSegments([text], [False], [True], False)


def test_options_need_whitespace_before_them():
    assert _spans("a well-known -v flag") == [" -v"]
    assert _spans("e-mail --help") == [" --help"]
    assert _spans("(-v) and '--quiet'") == ["(-v", "'--quiet"]


def test_sentences_are_cut_in_order_and_give_the_text_back():
    text = "Click <b>here</b> to see 3.14 at https://example.org/a?b=1."
    seg = protect.split_protected_text(text)
    assert seg.pieces == ["Click ", "<b>", "here", "</b>", " to see ", "3.14", " at ",
                          "https://example.org/a?b=1", "."]
    assert seg.protected == [False, True, False, True, False, True, False, True, False]
    # "." has no letter: passed through, not translated.
    assert seg.translate == [True, False, True, False, True, False, True, False, False]
    assert seg.split and "".join(seg.pieces) == text
    seg = protect.split_protected_text("Use --verbose to print %d more lines.")
    assert seg.pieces == ["Use", " --verbose", " to print ", "%d", " more lines."]
    seg = protect.split_protected_text("Could not open file {name}: permission denied.")
    assert seg.pieces == ["Could not open file ", "{name}", ": permission denied."]
    assert seg.translate == [True, False, True]


def test_pieces_without_a_letter_pass_through():
    seg = protect.split_protected_text("{0}: {1} (%d)")
    assert seg.pieces == ["{0}", ": ", "{1}", " (", "%d", ")"]
    assert not any(seg.translate)


def test_join_keeps_whitespace_around_spans_and_strips_the_ends():
    seg = protect.split_protected_text("  Use --verbose to print %d more lines. ")
    assert seg.pieces == ["  Use", " --verbose", " to print ", "%d", " more lines. "]
    out = protect.join_text(seg, ["USA", "IMPRIME", "MÁS "])
    assert out == "USA --verbose IMPRIME %d MÁS"
    whole = protect.split_protected_text(" Jesus wept. ")
    assert protect.join_text(whole, ["Jesús lloró. "]) == "Jesús lloró. "  # untouched


def test_pattern_off_and_bad_patterns():
    assert protect.split_protected_text("print %d", "").split is False
    assert protect.check_pattern("") == ""
    with pytest.raises(protect.PatternError, match="empty string"):
        protect.check_pattern("a*")
    with pytest.raises(protect.PatternError, match="not a valid regular expression"):
        protect.check_pattern("(")
    with pytest.raises(protect.PatternError, match="RE2"):
        protect.check_pattern(r"(?<=a)b")  # look-behind: Python has it, RE2 does not
    assert protect.check_pattern(protect.DEFAULT_PATTERN) == protect.DEFAULT_PATTERN


TWIN_TEXTS = SPANS + PLAIN + [
    "Use --verbose to print %d more lines.",
    "Could not open file {name}: permission denied.",
    "Click <b>here</b> to see 3.14 at https://example.org/a?b=1.",
    "Write to john.doe@example.org, or call 1,000 -2 times &amp; more.",
    "%d", "  %d  ", "{0}: {1}", "x --a --b--c", "-v at the start", "ends with -v",
    "Señor {nombre}, ¿tiene 3 libros?", "我爱你 %s 你好", "a\x00b %d",  # NUL: kept whole
    "tab\t--opt\nnew line <i>x</i>", "\u00a0%d\u2003word\u3000",
]


def test_the_graph_split_equals_the_python_twin():
    import tensorflow as tf

    seg = protect.split_protected(tf.constant(TWIN_TEXTS))
    assert seg.pieces.shape.rank == 2 and seg.split.shape == (len(TWIN_TEXTS),)
    pieces = seg.pieces.to_list()
    for i, text in enumerate(TWIN_TEXTS):
        twin = protect.split_protected_text(text)
        got = protect.TextSegments([p.decode("utf-8") for p in pieces[i]],
                                   seg.protected[i].numpy().tolist(),
                                   seg.translate[i].numpy().tolist(), bool(seg.split[i]))
        assert got == twin, text
        assert "".join(got.pieces) == text


def test_split_shapes_empty_batch_and_whole_rows():
    import tensorflow as tf

    seg = protect.split_protected(tf.constant([], tf.string))
    assert seg.pieces.nrows() == 0 and seg.split.shape == (0,)
    seg = protect.split_protected(tf.constant(["", "Jesus wept.", "%d"]))
    assert seg.pieces.to_list() == [[b""], [b"Jesus wept."], [b"%d"]]
    assert seg.protected.to_list() == [[False], [False], [True]]
    assert seg.translate.to_list() == [[True], [True], [False]]
    assert seg.split.numpy().tolist() == [False, False, True]


def test_join_translations_in_graph_equals_join_text():
    import tensorflow as tf

    texts = ["  Use --verbose to print %d more lines. ", " Jesus wept. ", "{0}: {1}", ""]
    seg = protect.split_protected(tf.constant(texts))
    translated = [p for row, flags in zip(seg.pieces.to_list(), seg.translate.to_list())
                  for p, t in zip(row, flags) if t]
    hyps = tf.constant([[p.strip().upper(), b"<" + p + b">"] for p in translated])  # (t, 2)
    joined = protect.join_translations(seg, hyps).numpy()  # (4, 2)
    assert joined.shape == (4, 2)
    for k in range(2):
        at = 0
        for i, text in enumerate(texts):
            twin = protect.split_protected_text(text)
            n = sum(twin.translate)
            want = protect.join_text(twin, [h.decode() for h in hyps[at:at + n, k].numpy()])
            assert joined[i, k].decode() == want
            at += n
    assert joined[0, 0].decode() == "USE --verbose TO PRINT %d MORE LINES."
    assert joined[1, 1].decode() == "< Jesus wept. >"  # unsplit: the translation untouched
    assert joined[2, 0].decode() == "{0}: {1}" and joined[3, 1].decode() == "<>"
