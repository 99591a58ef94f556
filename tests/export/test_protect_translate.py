"""Protected spans in the served graph: placeholders, options, numbers, URLs and markup pass
through the exported `Translator` unchanged, in order; an input without a span is translated
bit for bit as without protection; n-best joins and score sums; the SavedModel round trip; the
CTranslate2 engine protects the same spans.

A random-weight tiny model (nothing is trained): what it writes is noise, but deterministic
noise, which is all these checks need.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.export.serving_helpers import LONG

OPTIONS = dict(beam_size=2, n_best=2, max_extra_length=6, max_input_tokens=24)

SENTENCES = [
    "Use --verbose to print %d more lines.",
    "Could not open file {name}: permission denied.",
    "Click <b>here</b> to see 3.14 at https://example.org/a?b=1.",
    "Write to john.doe@example.org before 10:30, or call -v &amp; 1,000 more.",
    "Jesus wept.",  # no span: translated whole
    "",
]
# Nothing protected (CJK, unknown-only, over-long, empty and blank inputs included).
PLAIN = ["I love you.", "The Lord is my shepherd; I shall not want.", LONG, "我爱你",
         "ᚠᚢᚦ ᚨᚱᚲ", "", "   ", "Peace be with you, my friend."]


@pytest.fixture(scope="module")
def model(toy_config, toy_tokenizer):
    import keras

    from aiayn.pipeline.training.artifacts import build_model

    keras.utils.set_random_seed(11)
    return build_model(toy_config, toy_tokenizer, dtype="float32")


def _translator(model, tokenizer, **options):
    from aiayn.export.saved_model import ServingOptions, Translator

    return Translator(model, tokenizer, ServingOptions(**{**OPTIONS, **options}))


@pytest.fixture(scope="module")
def on(model, toy_tokenizer):
    return _translator(model, toy_tokenizer)


@pytest.fixture(scope="module")
def off(model, toy_tokenizer):
    return _translator(model, toy_tokenizer, protect_pattern="")


def _text(values):
    return [[v.decode("utf-8") for v in row] if isinstance(row, np.ndarray) else
            row.decode("utf-8") for row in values]


def _source(texts):
    """The pieces the graph translates, of all texts, in order (the Python twin's split)."""
    from aiayn.models.protect import split_protected_text

    segments = [split_protected_text(t) for t in texts]
    return segments, [p for s in segments for p, t in zip(s.pieces, s.translate) if t]


def _spans_in_order(text, spans):
    at = 0
    for span in spans:
        found = text.find(span, at)
        if found < 0:
            return False
        at = found + len(span)
    return True


def test_spans_pass_through_and_pieces_are_translated_as_one_batch(on, off):
    from aiayn.models.protect import join_text

    segments, source = _source(SENTENCES)
    got = on.translate(SENTENCES, n_best=True)
    best = on.translate(SENTENCES)
    # The graph's own batch of pieces, translated without protection: the same featuriser
    # input, so the same hypotheses and scores, piece by piece.
    pieces = off.translate(source, n_best=True)
    pieces_best = off.translate(source)
    translations = _text(got["translations"])
    assert got["translations"].shape == got["scores"].shape == (len(SENTENCES), 2)
    at = 0
    for i, seg in enumerate(segments):
        n = sum(seg.translate)
        for k in range(2):
            want = join_text(seg, [h[k] for h in _text(pieces["translations"][at:at + n])])
            assert translations[i][k] == want
            # Score of hypothesis k: the sum of the pieces' hypothesis-k scores.
            assert got["scores"][i, k] == pytest.approx(
                float(np.sum(pieces["scores"][at:at + n, k])), rel=1e-6, abs=1e-6)
            spans = [p.strip() for p, prot in zip(seg.pieces, seg.protected) if prot]
            assert _spans_in_order(translations[i][k], spans), (translations[i][k], spans)
        assert _text(best["translation"])[i] == join_text(
            seg, _text(pieces_best["translation"][at:at + n]))
        at += n
    assert at == len(source)
    out = _text(best["translation"])
    assert out[-1] == "" and best["score"][-1] == 0.0
    for span in ("--verbose", "%d", "{name}", "<b>", "</b>", "3.14",
                 "https://example.org/a?b=1", "john.doe@example.org", "10:30", "-v", "&amp;",
                 "1,000"):
        assert span in " ".join(out), span


def test_inputs_without_spans_are_translated_bit_for_bit_as_before(on, off, model,
                                                                   toy_tokenizer):
    import tensorflow as tf

    for n_best in (False, True):
        a, b = on.translate(PLAIN, n_best=n_best), off.translate(PLAIN, n_best=n_best)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)

    # ... and as the model's own generate says, ids and scores, through the one featuriser.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def direct(text):
        features = toy_tokenizer.featurize_source(text, on.input_limit)
        out = model.generate(features.token_ids, features.padding_mask,
                             bos_id=toy_tokenizer.bos_id, eos_id=toy_tokenizer.eos_id,
                             beam_size=2, length_penalty=0.6, max_extra_length=6, n_best=2,
                             dynamic_shapes=True)
        return out["token_ids"], out["scores"], features.empty

    ids, scores, empty = direct(tf.constant(PLAIN))
    ids = ids.numpy()  # (batch, 2, len)
    texts = toy_tokenizer.detokenize(ids.reshape(len(PLAIN) * 2, -1)).numpy().reshape(-1, 2)
    texts = np.where(empty.numpy()[:, None], b"", texts)
    got = on.translate(PLAIN, n_best=True)
    np.testing.assert_array_equal(got["translations"], texts)
    np.testing.assert_array_equal(got["scores"], np.where(empty.numpy()[:, None], 0.0,
                                                          scores.numpy()))


def test_truncated_and_unknown_fraction_count_translated_pieces_only(on, off):
    texts = ["I love Привет {0}", LONG + " %d", "Use --verbose to print %d more lines.",
             "I love Привет"]
    got = on.translate(texts, n_best=True)
    # 6 of the 11 visible characters of "I love Привет" are unknown; "{0}" does not count.
    assert got["unknown_fraction"][0] == pytest.approx(6 / 11)
    assert got["unknown_fraction"][3] == off.translate(texts[3:], n_best=True)[
        "unknown_fraction"][0]
    # Over several pieces: their unknown characters over their visible characters.
    _, source = _source(texts[2:3])
    fractions = off.translate(source, n_best=True)["unknown_fraction"]
    visible = [len("".join(p.split())) for p in source]
    assert got["unknown_fraction"][2] == pytest.approx(
        sum(round(f * v) for f, v in zip(fractions, visible)) / sum(visible))
    assert 0 < got["unknown_fraction"][2] < off.translate(texts[2:3], n_best=True)[
        "unknown_fraction"][0]  # "%" and "-" are unknown, but protected
    assert got["truncated"].tolist() == [False, True, False, False]


def test_nothing_to_translate(on):
    texts = ["%d", "{0}: {1}", "  -v  ", "3.14"]
    got = on.translate(texts, n_best=True)
    assert _text(got["translations"]) == [[t.strip()] * 2 for t in texts]
    assert not got["scores"].any() and not got["truncated"].any()
    assert not got["unknown_fraction"].any()
    empty = on.translate([])
    assert empty["translation"].shape == (0,) and empty["score"].shape == (0,)


def test_invalid_utf8_is_refused_even_in_a_passed_through_piece(on):
    import tensorflow as tf

    with pytest.raises(tf.errors.InvalidArgumentError, match="valid UTF-8"):
        on.translate([b"ok %d", b"%d \xff\xfe"])


def test_reject_applies_per_piece(model, toy_tokenizer):
    import tensorflow as tf

    strict = _translator(model, toy_tokenizer, max_input_tokens=12, on_long_input="reject")
    short = "The Lord is my shepherd"
    count = len(toy_tokenizer.tokenize(tf.constant([short])).to_list()[0])
    assert 2 * count > strict.input_limit >= count  # whole: too long; each piece: not
    out = strict.translate([f"{short} %d {short}"])
    assert "%d" in _text(out["translation"])[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="too long"):
        strict.translate([f"{short} {short} %d"])


def test_options_validate_and_read_the_config(toy_config):
    import dataclasses

    from aiayn.export.saved_model import ExportError, ServingOptions
    from aiayn.models.protect import DEFAULT_PATTERN

    assert ServingOptions().protect_pattern == DEFAULT_PATTERN
    assert ServingOptions.from_configs(toy_config.decode, toy_config.export).protect_pattern \
        == getattr(toy_config.export, "protect_pattern", DEFAULT_PATTERN)
    with pytest.raises(ExportError, match="protect_pattern"):
        ServingOptions(protect_pattern="a*")
    with pytest.raises(ExportError, match="RE2"):
        ServingOptions(protect_pattern=r"(?<=-)v")

    @dataclasses.dataclass
    class Export:
        max_input_tokens: int = 24
        on_long_input: str = "truncate"
        max_batch_size: int = 8
        protect_pattern: str = ""

    assert ServingOptions.from_configs(toy_config.decode, Export()).protect_pattern == ""


@pytest.mark.slow
def test_savedmodel_round_trip_gives_the_same_outputs(model, toy_tokenizer, on, tmp_path):
    import tensorflow as tf

    from aiayn.export.client import LocalClient
    from aiayn.export.saved_model import ServingOptions, export_saved_model
    from aiayn.export.servables import Servable
    from aiayn.export.verify import verify_export

    texts = SENTENCES + PLAIN[:2]
    path = export_saved_model(model, toy_tokenizer, tmp_path, "translate",
                              options=ServingOptions(**OPTIONS), sample_texts=SENTENCES[:1],
                              bucket_boundaries=(8,))
    loaded = tf.saved_model.load(str(path))
    for key, n_best in (("serving_default", False), ("n_best", True)):
        served = loaded.signatures[key](text=tf.constant(texts))
        want = on.translate(texts, n_best=n_best)
        assert served.keys() == want.keys()
        for name, value in served.items():
            np.testing.assert_array_equal(value.numpy(), want[name], err_msg=f"{key}.{name}")
    # A fresh TensorFlow-only process: stock ops only (the split is tensorflow-text's
    # RegexSplitWithOffsets, linked into the model server like the SentencePiece ops), and
    # the same outputs.
    report = verify_export(path, texts=texts, expected={
        "serving_default": {k: v.tolist() if v.dtype != object else _text(v)
                            for k, v in on.translate(texts).items()},
        "n_best": {k: v.tolist() if v.dtype != object else _text(v)
                   for k, v in on.translate(texts, n_best=True).items()}})
    assert report.ok, report.problems
    assert report.ops["RegexSplitWithOffsets"] == "tensorflow_text"
    samples = json.loads((path / "assets.extra" / "verify_samples.json").read_text())
    assert samples["options"]["protect_pattern"] == on.options.protect_pattern
    # The local client's unknown fractions and the development server's length check count
    # the pieces the graph translates.
    served = on.translate(texts, n_best=True)["unknown_fraction"]
    assert LocalClient(path).unknown_fractions(texts) == pytest.approx(served.tolist())
    short = "The Lord is my shepherd; I shall not want."
    count = len(toy_tokenizer.tokenize(tf.constant([short])).to_list()[0])
    limit = samples["input_limit"]
    assert 2 * count > limit >= count
    servable = Servable("translate", 1, path, None, 5.0)
    try:
        long = servable.long_inputs(np.array([f"{short} {short}", f"{short} %d {short}",
                                              f"{short} {short} {{0}}", "%d"], dtype=object))
    finally:
        servable.close()
    assert [i for i, _ in long] == [0, 2] and all(n > limit for _, n in long)


def test_ctranslate2_protects_the_same_spans(model, toy_tokenizer, tmp_path):
    pytest.importorskip("ctranslate2")
    from aiayn.export import ctranslate2 as ct2
    from aiayn.export.saved_model import ServingOptions

    greedy = dict(beam_size=1, n_best=1)
    path = ct2.convert(model, toy_tokenizer, ServingOptions(**{**OPTIONS, **greedy}),
                       tmp_path / "ct2")
    engine = ct2.CTranslate2Translator(path, intra_threads=1)
    texts = SENTENCES + ["I love Привет {0}", LONG + " %d", "%d", "Jesus wept."]
    got = engine.translate(texts, n_best=True)
    want = _translator(model, toy_tokenizer, **greedy).translate(texts, n_best=True)
    # Greedy search is token-identical between the engines (test_ctranslate2.py): so are the
    # joined texts; scores differ only by the length penalty's formula.
    assert [r.text for r in got] == [row[0] for row in _text(want["translations"])]
    assert [r.truncated for r in got] == want["truncated"].tolist()
    assert [r.unknown_fraction for r in got] == pytest.approx(
        want["unknown_fraction"].tolist(), abs=1e-6)
    # The pattern travels in aiayn_ct2.json; an export without it uses the default.
    settings_path = path / ct2.SETTINGS_FILE
    settings = json.loads(settings_path.read_text())
    assert settings["protect_pattern"] == ServingOptions().protect_pattern
    del settings["protect_pattern"]
    settings_path.write_text(json.dumps(settings))
    old = ct2.CTranslate2Translator(path, intra_threads=1)
    assert [r.text for r in old.translate(texts)] == [r.text for r in got]
    settings["protect_pattern"] = ""  # off: every text whole, as before
    settings_path.write_text(json.dumps(settings))
    assert not ct2.CTranslate2Translator(path).segments(["Print %d lines."])[0].split
