"""SubwordTokenizer: round trip, special ids from the model, CJK, NFKC, SavedModel."""

import unicodedata

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from aiayn.models.tokenizer import SubwordTokenizer


def _texts(strings):
    return [s.decode("utf-8") for s in np.asarray(strings).tolist()]


def test_special_ids_come_from_the_model(spm_model_path, toy_tokenizer):
    reference = spm.SentencePieceProcessor(model_file=str(spm_model_path))
    assert (toy_tokenizer.pad_id, toy_tokenizer.unk_id, toy_tokenizer.bos_id,
            toy_tokenizer.eos_id) == (reference.pad_id(), reference.unk_id(),
                                      reference.bos_id(), reference.eos_id()) == (0, 1, 2, 3)
    assert toy_tokenizer.vocabulary_size == reference.get_piece_size()
    assert toy_tokenizer.model_proto == spm_model_path.read_bytes()
    pieces = _texts(toy_tokenizer.id_to_piece(tf.constant([0, 1, 2, 3])))
    assert pieces == ["<pad>", "<unk>", "<s>", "</s>"]


def test_special_ids_follow_a_model_with_other_ids(toy_pairs):
    # A model trained with different ids: the wrapper must follow it, not assume 0..3.
    import io

    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([s for pair in toy_pairs for s in pair]), model_writer=writer,
        vocab_size=150, hard_vocab_limit=False, pad_id=3, unk_id=0, bos_id=1, eos_id=2,
        minloglevel=2)
    tokenizer = SubwordTokenizer(writer.getvalue())
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (3, 0, 1, 2)


def test_tokenize_returns_ragged_int32_without_bos_eos(toy_tokenizer):
    ids = toy_tokenizer.tokenize(tf.constant(["I love you.", "Jesus wept."]))
    assert isinstance(ids, tf.RaggedTensor)
    assert ids.dtype == tf.int32 and ids.shape.rank == 2
    flat = ids.flat_values.numpy()
    assert flat.size > 0
    assert not np.isin(flat, [toy_tokenizer.bos_id, toy_tokenizer.eos_id,
                              toy_tokenizer.pad_id]).any()


def test_round_trip_including_cjk(toy_tokenizer, toy_pairs):
    texts = [s for pair in toy_pairs for s in pair]
    ids = toy_tokenizer.tokenize(tf.constant(texts))
    # Round trip up to the model's NFKC normalisation (e.g. "，" -> ",", "Ａ" -> "A").
    assert _texts(toy_tokenizer.detokenize(ids)) == [unicodedata.normalize("NFKC", t)
                                                     for t in texts]
    # The paper's motivating example: text without spaces.
    cjk = toy_tokenizer.tokenize(tf.constant(["我爱你"]))
    assert cjk.row_lengths().numpy()[0] >= 1
    assert toy_tokenizer.unk_id not in cjk.flat_values.numpy().tolist()
    assert _texts(toy_tokenizer.detokenize(cjk)) == ["我爱你"]


def test_nfkc_normalisation_is_in_graph(toy_tokenizer):
    full_width = toy_tokenizer.tokenize(tf.constant(["ＡＢＣ １２３"]))
    ascii_ids = toy_tokenizer.tokenize(tf.constant(["ABC 123"]))
    assert full_width.to_list() == ascii_ids.to_list()
    assert _texts(toy_tokenizer.detokenize(full_width)) == ["ABC 123"]


def test_detokenize_dense_stops_at_first_eos_or_pad(toy_tokenizer):
    ids = toy_tokenizer.tokenize(tf.constant(["I love you.", "Jesus wept."]))
    eos, pad = toy_tokenizer.eos_id, toy_tokenizer.pad_id
    rows = ids.to_list()
    junk = toy_tokenizer.tokenize(tf.constant(["God"])).to_list()[0]
    width = max(len(r) for r in rows) + 1 + len(junk) + 2
    dense = []
    for row, stop in zip(rows, (eos, pad)):
        full = row + [stop] + junk  # tokens after the stop id must be ignored
        dense.append(full + [pad] * (width - len(full)))
    out = toy_tokenizer.detokenize(tf.constant(dense, tf.int64))
    assert _texts(out) == ["I love you.", "Jesus wept."]
    with pytest.raises(ValueError, match="shape"):
        toy_tokenizer.detokenize(tf.constant([1, 2, 3]))


def test_featurize_source_truncates_pads_and_marks_empty_rows(toy_tokenizer):
    long = "In the beginning God created the heavens and the earth."
    texts = [long, "我爱你", "", "   "]
    pieces = toy_tokenizer.tokenize(tf.constant(texts)).to_list()
    f = toy_tokenizer.featurize_source(tf.constant(texts), 5)
    assert f.token_ids.dtype == tf.int32 and f.padding_mask.dtype == tf.bool
    width = min(5, max(len(p) for p in pieces))
    assert f.token_ids.shape == (4, width)
    np.testing.assert_array_equal(f.lengths.numpy(), [len(p) for p in pieces])
    np.testing.assert_array_equal(f.truncated.numpy(), [len(p) > 5 for p in pieces])
    np.testing.assert_array_equal(f.empty.numpy(), [False, False, True, True])
    ids, mask = f.token_ids.numpy(), f.padding_mask.numpy()
    # Ordinary rows: the first `limit` ids, then pad; the mask is True exactly on real tokens.
    for row, p in enumerate(pieces[:2]):
        kept = p[:5]
        assert ids[row, :len(kept)].tolist() == kept
        assert (ids[row, len(kept):] == toy_tokenizer.pad_id).all()
        assert mask[row].tolist() == [i < len(kept) for i in range(width)]
    # Empty rows: a lone EOS, so that no row attends over no keys.
    for row in (2, 3):
        assert ids[row, 0] == toy_tokenizer.eos_id and mask[row].tolist() == [True] + [False] * (
            width - 1)
    with pytest.raises(ValueError, match="limit"):
        toy_tokenizer.featurize_source(tf.constant(["x"]), 0)


def test_featurize_source_unknown_fraction_counts_characters(toy_tokenizer):
    # The toy vocabulary knows Latin and the CJK of its corpus, not Cyrillic.
    texts = ["I love you.", "我爱你", "Привет", "I love Привет", "", "   ",
             "Привет мир 我爱你", "Привет" * 40]
    want = [0.0, 0.0, 1.0, 6 / 11, 0.0, 0.0, 9 / 12, 1.0]  # unknown / visible characters
    f = toy_tokenizer.featurize_source(tf.constant(texts), 3)  # truncation does not matter
    assert f.unknown_fraction.dtype == tf.float32 and f.unknown_fraction.shape == (len(texts),)
    np.testing.assert_allclose(f.unknown_fraction.numpy(), want, atol=1e-6)
    # Characters, not pieces: SentencePiece merges a run of unknown characters into one <unk>.
    pieces = toy_tokenizer.tokenize(tf.constant(["Привет"])).to_list()[0]
    assert pieces.count(toy_tokenizer.unk_id) == 1 and len(pieces) < 2 * 6
    # The ids come from the offsets op: the same as tokenize(), so training's source side
    # (tokenize) and the featuriser still agree.
    ids = toy_tokenizer.tokenize(tf.constant(texts)).to_list()
    for row, expected in enumerate(ids):
        if expected:
            assert f.token_ids.numpy()[row, :len(expected[:3])].tolist() == expected[:3]
    # In a graph with a [None] input, as the export traces it.
    traced = tf.function(lambda t: toy_tokenizer.featurize_source(t, 8).unknown_fraction,
                         input_signature=[tf.TensorSpec([None], tf.string)])
    np.testing.assert_allclose(traced(tf.constant(texts)).numpy(), want, atol=1e-6)
    assert traced(tf.constant([], tf.string)).numpy().shape == (0,)


def test_featurize_source_all_empty_and_zero_batch(toy_tokenizer):
    f = toy_tokenizer.featurize_source(tf.constant([""]), 8)
    assert f.token_ids.numpy().tolist() == [[toy_tokenizer.eos_id]]
    none = toy_tokenizer.featurize_source(tf.constant([], tf.string), 8)
    assert none.token_ids.shape == (0, 1) and none.padding_mask.shape == (0, 1)


def test_featurize_source_rejects_invalid_utf8(toy_tokenizer):
    with pytest.raises(tf.errors.InvalidArgumentError, match="valid UTF-8"):
        toy_tokenizer.featurize_source(tf.constant([b"ok", b"\xff\xfe"]), 8)


def test_source_limit_caps_at_the_position_table():
    from aiayn.models.limits import source_limit

    assert source_limit(256, 1024, 50) == 256
    assert source_limit(256, 200, 50) == 149  # 149 + 50 + BOS = 200 positions
    with pytest.raises(ValueError, match="max_position=40.*max_extra_length=50"):
        source_limit(256, 40, 50)


def test_from_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="aiayn vocab"):
        SubwordTokenizer.from_file(tmp_path / "missing.model")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="SentencePiece"):
        SubwordTokenizer.from_file(bad)


def test_saved_model_carries_the_tokenizer(toy_tokenizer, tmp_path):
    """The tokenizer lives inside a SavedModel: the model file is not needed to reload it."""

    class Exported(tf.Module):
        def __init__(self, tokenizer):
            super().__init__()
            self.tokenizer = tokenizer

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def round_trip(self, text):
            ids = self.tokenizer.tokenize(text)
            dense = ids.to_tensor(default_value=self.tokenizer.pad_id)
            return {"text": self.tokenizer.detokenize(dense), "lengths": ids.row_lengths()}

    module = Exported(toy_tokenizer)
    path = str(tmp_path / "saved")
    tf.saved_model.save(module, path, signatures={"serving_default": module.round_trip})
    del module
    loaded = tf.saved_model.load(path)
    texts = ["I love you.", "我爱你", "ＡＢＣ"]
    out = loaded.signatures["serving_default"](text=tf.constant(texts))
    assert _texts(out["text"]) == ["I love you.", "我爱你", "ABC"]
    expected = toy_tokenizer.tokenize(tf.constant(texts)).row_lengths().numpy()
    np.testing.assert_array_equal(out["lengths"].numpy(), expected)


def test_seeding_after_construction_does_not_break_the_tokenizer(spm_model_path):
    # Eager tf.random.set_seed clears the kernel cache that owns the SentencePiece resource;
    # the wrapper re-creates it, in eager calls and in tf.data maps traced afterwards.
    import keras

    tok = SubwordTokenizer.from_file(spm_model_path)
    before = tok.tokenize(["In the beginning"]).to_list()
    keras.utils.set_random_seed(7)
    assert tok.tokenize(["In the beginning"]).to_list() == before
    keras.utils.set_random_seed(8)
    ds = tf.data.Dataset.from_tensor_slices(["In the beginning"]).batch(1).map(
        lambda s: tok.tokenize(s).to_tensor())
    assert [row.tolist() for batch in ds.as_numpy_iterator() for row in batch] == before
    assert tok.detokenize(tf.ragged.constant(before)).numpy().tolist() == [b"In the beginning"]


SAMPLED = "In the beginning God created the heavens and the earth."


def test_sampling_varies_the_segmentation_and_keeps_the_text(toy_tokenizer):
    best = toy_tokenizer.tokenize([SAMPLED]).to_list()[0]
    assert toy_tokenizer.tokenize([SAMPLED], alpha=0.0).to_list()[0] == best  # 0 = no sampling
    draws = [toy_tokenizer.tokenize([SAMPLED], alpha=0.1).to_list()[0] for _ in range(20)]
    assert len({tuple(d) for d in draws}) > 1           # segmented anew at each call
    assert any(d != best for d in draws)
    for ids in draws + [toy_tokenizer.tokenize([SAMPLED], alpha=0.1, nbest_size=4).to_list()[0]]:
        assert _texts(toy_tokenizer.detokenize(tf.ragged.constant([ids]))) == [SAMPLED]


@pytest.mark.parametrize("alpha, nbest_size", [(-0.1, -1), (0.2, 0), (0.2, 1)])
def test_sampling_rejects_settings_that_do_not_sample(toy_tokenizer, alpha, nbest_size):
    with pytest.raises(ValueError, match=f"alpha={alpha}, nbest_size={nbest_size}"):
        toy_tokenizer.tokenize([SAMPLED], alpha=alpha, nbest_size=nbest_size)


def test_sampling_ops_stay_out_of_a_saved_model(spm_model_path, tmp_path):
    # Only training samples: the export must carry the one SentencePiece op, not a copy of the
    # model proto per sampling setting.
    def saved_graph(tokenizer, name):
        tf.saved_model.save(tokenizer, str(tmp_path / name))
        return (tmp_path / name / "saved_model.pb").read_bytes()

    plain = saved_graph(SubwordTokenizer.from_file(spm_model_path), "plain")
    tok = SubwordTokenizer.from_file(spm_model_path)
    tok.tokenize([SAMPLED], alpha=0.1)
    tok.tokenize([SAMPLED], alpha=0.5, nbest_size=8)
    assert list(tok._trackable_children()) == ["_sentencepiece"]
    sampled = saved_graph(tok, "sampled")
    assert plain.count(b"SentencepieceOp") == sampled.count(b"SentencepieceOp") >= 1
    assert len(sampled) == len(plain)


def test_sampling_survives_seeding_after_construction(spm_model_path):
    import keras

    tok = SubwordTokenizer.from_file(spm_model_path)
    tok.tokenize([SAMPLED], alpha=0.1)
    keras.utils.set_random_seed(9)  # clears the kernel cache: both ops' resources are lost
    ds = tf.data.Dataset.from_tensor_slices([SAMPLED]).batch(1).map(
        lambda s: tok.tokenize(s, alpha=0.1).to_tensor())
    ids = [row[row > 0].tolist() for batch in ds.as_numpy_iterator() for row in batch]
    assert _texts(tok.detokenize(tf.ragged.constant(ids))) == [SAMPLED]
