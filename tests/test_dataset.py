"""tf.data pipelines: exact features, shift by one, token budget, determinism, efficiency."""

import dataclasses
import random
import threading

import numpy as np
import pytest
import tensorflow as tf

from aiayn.pipeline.data import dataset as dataset_lib
from aiayn.pipeline.data.dataset import (
    FEATURE_KEYS,
    batch_by_token_budget,
    batch_statistics,
    concatenate_pairs,
    effective_boundaries,
    featurize_pairs,
    length_filter_counts,
    make_train_dataset,
)
from aiayn.pipeline.errors import UserInputError

NUM_PAIRS = 400


@pytest.fixture(scope="module")
def corpus(toy_pairs, tmp_path_factory):
    """A TSV of NUM_PAIRS pairs of varied length made from the toy corpus' words."""
    rng = random.Random(0)
    en_words = " ".join(p[0] for p in toy_pairs[:24]).split()
    es_words = " ".join(p[1] for p in toy_pairs[:24]).split()
    pairs = []
    for _ in range(NUM_PAIRS):
        n = max(1, min(int(rng.lognormvariate(1.6, 0.6)), 24))
        pairs.append((" ".join(rng.choices(en_words, k=n)),
                      " ".join(rng.choices(es_words, k=max(1, n + rng.randint(-1, 2))))))
    pairs[5] = ("我爱你", "我爱你")
    path = tmp_path_factory.mktemp("corpus") / "train.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path, pairs


def _take(dataset, n):
    return [(tf.nest.map_structure(lambda x: x.numpy(), f), labels.numpy())
            for f, labels in dataset.take(n)]


def test_train_batches_exact_keys_dtypes_shapes(corpus, toy_tokenizer, toy_config):
    data = toy_config.data
    bounds = effective_boundaries(data.bucket_boundaries, data.max_length)
    dataset = make_train_dataset(corpus[0], toy_tokenizer, data, seed=1)
    features_spec, labels_spec = dataset.element_spec
    assert sorted(features_spec) == sorted(FEATURE_KEYS)
    assert features_spec["encoder_token_ids"].dtype == tf.int32
    assert features_spec["encoder_padding_mask"].dtype == tf.bool
    assert features_spec["decoder_token_ids"].dtype == tf.int32
    assert features_spec["decoder_padding_mask"].dtype == tf.bool
    assert labels_spec.dtype == tf.int32
    assert all(spec.shape.rank == 2 for spec in tf.nest.flatten(dataset.element_spec))
    for features, labels in _take(dataset, 20):
        batch, src_len = features["encoder_token_ids"].shape
        assert features["encoder_padding_mask"].shape == (batch, src_len)
        tgt_len = labels.shape[1]
        assert features["decoder_token_ids"].shape == features["decoder_padding_mask"].shape == (
            batch, tgt_len)
        # Padded lengths come from the fixed boundaries; batch size from the token budget.
        assert src_len in bounds and tgt_len in bounds
        assert batch == data.token_budget // max(src_len, tgt_len)


def test_decoder_inputs_and_labels_shifted_by_one(corpus, toy_tokenizer, toy_config):
    tok = toy_tokenizer
    for features, labels in _take(make_train_dataset(corpus[0], tok, toy_config.data, 3), 10):
        enc, enc_mask = features["encoder_token_ids"], features["encoder_padding_mask"]
        dec, dec_mask = features["decoder_token_ids"], features["decoder_padding_mask"]
        np.testing.assert_array_equal(enc_mask, enc != tok.pad_id)
        np.testing.assert_array_equal(dec_mask, dec != tok.pad_id)
        np.testing.assert_array_equal(dec_mask, labels != tok.pad_id)
        assert enc_mask[:, 0].all()  # no empty source
        # Masks are a prefix of True then False.
        assert (np.diff(dec_mask.astype(int), axis=1) <= 0).all()
        assert (dec[:, 0] == tok.bos_id).all()
        lengths = dec_mask.sum(axis=1)
        for row, n in enumerate(lengths):
            np.testing.assert_array_equal(dec[row, 1:n], labels[row, :n - 1])
            assert labels[row, n - 1] == tok.eos_id
            assert tok.eos_id not in labels[row, :n - 1] and tok.bos_id not in dec[row, 1:n]
            assert (labels[row, n:] == tok.pad_id).all()


def test_token_budget_never_exceeded_and_lengths_filtered(corpus, toy_tokenizer, toy_config):
    data = dataclasses.replace(toy_config.data, max_length=12, token_budget=60,
                               bucket_boundaries=(4, 8))
    stats = batch_statistics(_take(make_train_dataset(corpus[0], toy_tokenizer, data, 0), 60))
    assert stats["max_batch_tokens"] <= 60
    assert stats["shapes"] <= 9  # (4, 8, 12) x (4, 8, 12) at most
    for features, _ in _take(make_train_dataset(corpus[0], toy_tokenizer, data, 0), 30):
        assert features["encoder_padding_mask"].sum(axis=1).max() <= 12
        assert features["decoder_padding_mask"].sum(axis=1).max() <= 12


def _signature(batches):
    return [f["encoder_token_ids"].tobytes() + labels.tobytes() for f, labels in batches]


def test_same_seed_same_order_other_seed_other_order(corpus, toy_tokenizer, toy_config):
    data = toy_config.data

    def run(seed):
        return _signature(_take(make_train_dataset(corpus[0], toy_tokenizer, data, seed), 12))

    first = run(7)
    assert first == run(7)
    assert first != run(8)


def test_subword_sampling_resegments_the_same_pairs(corpus, toy_tokenizer, toy_config):
    # data.subword_alpha > 0: every batch still decodes to pairs of the corpus, with BOS/EOS and
    # the shift by one, but the pieces are drawn anew, so the ids differ from the best
    # segmentation's (same seed: same line order).
    tok = toy_tokenizer

    def normalised(texts):  # the model's NFKC normaliser, as decoded text
        return [t.decode() for t in tok.detokenize(tok.tokenize(list(texts))).numpy()]

    pairs = set(zip(normalised(s for s, _ in corpus[1]), normalised(t for _, t in corpus[1])))
    sampled = dataclasses.replace(toy_config.data, subword_alpha=0.1)
    batches = _take(make_train_dataset(corpus[0], tok, sampled, seed=7), 12)
    best = _take(make_train_dataset(corpus[0], tok, toy_config.data, seed=7), 12)
    assert _signature(batches) != _signature(best)
    decoded = 0
    for features, labels in batches:
        enc_mask, dec_mask = features["encoder_padding_mask"], features["decoder_padding_mask"]
        sources = tok.detokenize(tf.ragged.boolean_mask(features["encoder_token_ids"], enc_mask))
        lengths = dec_mask.sum(axis=1)
        targets = tok.detokenize(tf.ragged.boolean_mask(labels, labels != tok.eos_id))
        for s, t, row, n in zip(sources.numpy(), targets.numpy(), range(len(lengths)), lengths):
            assert (s.decode(), t.decode()) in pairs
            assert features["decoder_token_ids"][row, 0] == tok.bos_id
            assert labels[row, n - 1] == tok.eos_id
            np.testing.assert_array_equal(features["decoder_token_ids"][row, 1:n],
                                          labels[row, :n - 1])
            decoded += 1
    assert decoded > 12


@pytest.mark.parametrize("alpha, rereads", [(0.0, False), (0.1, True)],
                         ids=["one-segmentation-cached", "sampled-each-epoch"])
def test_the_file_is_tokenised_once_unless_subwords_are_sampled(tmp_path, toy_tokenizer,
                                                                toy_config, alpha, rereads):
    # With one segmentation the first epoch's examples are kept in memory: a file changed
    # after it does not reach training. Sampling segments every epoch anew from the file.
    path = _write_tsv(tmp_path / "train.tsv", [("I love you.", "Te amo.")] * 40)
    data = dataclasses.replace(toy_config.data, subword_alpha=alpha, shuffle_buffer=1000,
                               token_budget=64, bucket_boundaries=(8, 16))
    batches = iter(make_train_dataset(path, toy_tokenizer, data, seed=0))
    next(batches)  # the whole file is in the shuffle buffer (1000 >= 40 lines) ...
    _write_tsv(path, [("Jesus wept.", "Jesús lloró.")] * 40)  # ... before this
    sources = set()
    for _ in range(600):  # 120 epochs: far past what tokenising 256 lines at a time reads ahead
        features, _ = next(batches)
        ids = tf.ragged.boolean_mask(features["encoder_token_ids"],
                                     features["encoder_padding_mask"])
        sources.update(t.decode() for t in toy_tokenizer.detokenize(ids).numpy())
        if "Jesus wept." in sources:
            break
    assert ("Jesus wept." in sources) == rereads
    assert "I love you." in sources


def test_train_epochs_cover_the_corpus(corpus, toy_tokenizer, toy_config):
    # Every pair that passes the length filter shows up (rare buckets fill after a few epochs);
    # longer ones never do.
    data = dataclasses.replace(toy_config.data, max_length=64, token_budget=256,
                               bucket_boundaries=(8, 16, 32))
    sources = toy_tokenizer.tokenize([s for s, _ in corpus[1]]).to_list()
    targets = toy_tokenizer.tokenize([t for _, t in corpus[1]]).to_list()
    fits = [len(s) <= 64 and len(t) + 1 <= 64 for s, t in zip(sources, targets)]
    expected = {tuple(s) for s, ok in zip(sources, fits) if ok}
    assert not all(fits)  # the filter has something to drop
    seen = set()
    for features, _ in make_train_dataset(corpus[0], toy_tokenizer, data, 0).take(3000):
        ids, mask = features["encoder_token_ids"].numpy(), features["encoder_padding_mask"].numpy()
        seen.update(tuple(row[m]) for row, m in zip(ids, mask))
        if len(seen) >= len(expected):
            break
    assert seen == expected


BOS, EOS = 2, 3


def _example(source, target):
    ids = lambda values: np.array(values, np.int32)  # noqa: E731
    return ({"encoder_token_ids": ids(source), "encoder_padding_mask": np.ones(len(source), bool),
             "decoder_token_ids": ids([BOS] + target),
             "decoder_padding_mask": np.ones(len(target) + 1, bool)}, ids(target + [EOS]))


def _stream(examples):
    spec = tf.nest.map_structure(lambda v: tf.TensorSpec([None], v.dtype), examples[0])
    return tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=spec)


def _listed(dataset):
    return [(f["encoder_token_ids"].tolist(), f["decoder_token_ids"].tolist(), labels.tolist(),
             bool(f["encoder_padding_mask"].all() and f["decoder_padding_mask"].all()))
            for f, labels in dataset.as_numpy_iterator()]


TOY_STREAM = [_example([10, 11], [20]), _example([12], [21, 22]), _example([13, 14, 15], [23]),
              _example([16], [24, 25, 26]), _example([17], [27])]


def test_concatenation_joins_two_by_two_without_inner_bos_or_eos():
    joined = _listed(_stream(TOY_STREAM).apply(concatenate_pairs(1.0, 128, seed=0)))
    assert joined == [([10, 11, 12], [BOS, 20, 21, 22], [20, 21, 22, EOS], True),
                      ([13, 14, 15, 16], [BOS, 23, 24, 25, 26], [23, 24, 25, 26, EOS], True),
                      ([17], [BOS, 27], [27, EOS], True)]  # the odd last one passes alone


def test_concatenation_keeps_pairs_that_would_not_fit_and_loses_nothing():
    # max_length 4: the first two join (source 3, decoder side 4); the next two would make a
    # decoder side of 5 and pass as they are. Fraction 0 passes the stream through.
    kept = _listed(_stream(TOY_STREAM).apply(concatenate_pairs(1.0, 4, seed=0)))
    assert [row[0] for row in kept] == [[10, 11, 12], [13, 14, 15], [16], [17]]
    assert kept[1:] == _listed(_stream(TOY_STREAM[2:]))
    assert _listed(_stream(TOY_STREAM).apply(concatenate_pairs(0.0, 128, seed=0))) == _listed(
        _stream(TOY_STREAM))


def test_concatenation_pairs_across_groups_as_one_at_a_time():
    # 131 examples span several of the join's groups of pairs (JOIN_GROUP_PAIRS a call): every
    # pair (2i, 2i + 1) joins when it fits, wherever a group boundary falls, and the odd last
    # example passes alone. The reference joins one pair at a time, in plain Python.
    examples = [([30 + i] * (1 + i % 4), [40 + i] * (1 + i % 3)) for i in range(131)]
    joined = _listed(_stream([_example(s, t) for s, t in examples]).apply(
        concatenate_pairs(1.0, 6, seed=0)))
    expected = []
    for (s1, t1), (s2, t2) in zip(examples[0::2], examples[1::2]):
        if len(s1 + s2) <= 6 and len(t1 + t2) + 1 <= 6:
            expected.append((s1 + s2, [BOS] + t1 + t2, t1 + t2 + [EOS], True))
        else:
            expected += [(s1, [BOS] + t1, t1 + [EOS], True), (s2, [BOS] + t2, t2 + [EOS], True)]
    expected.append((examples[-1][0], [BOS] + examples[-1][1], examples[-1][1] + [EOS], True))
    assert joined == expected
    assert 0 < len(expected) - 66 < 65  # some pairs joined, some passed as two


def test_concatenation_share_and_seed():
    stream = _stream([_example([10 + i % 50], [20 + i % 50]) for i in range(2000)])

    def joined_share(seed):
        rows = _listed(stream.apply(concatenate_pairs(0.3, 128, seed=seed)))
        return sum(len(r[0]) == 2 for r in rows) / 1000, rows

    share, rows = joined_share(5)
    assert 0.25 < share < 0.35  # 1,000 draws of p = 0.3: 4.8 standard deviations either side
    assert [t for r in rows for t in r[0]] == [10 + i % 50 for i in range(2000)]
    assert joined_share(5)[1] == rows and joined_share(6)[1] != rows


def test_training_batches_with_concatenation(corpus, toy_tokenizer, toy_config):
    # data.concat_fraction: the batches keep every invariant (shift by one, one BOS and one EOS
    # a row, the token budget), and every source row is one source of the corpus or two joined,
    # most of them two.
    tok = toy_tokenizer
    data = dataclasses.replace(toy_config.data, max_length=64, token_budget=256,
                               bucket_boundaries=(8, 16, 32), concat_fraction=1.0)
    sources = {tuple(s) for s in tok.tokenize([s for s, _ in corpus[1]]).to_list()}
    batches = _take(make_train_dataset(corpus[0], tok, data, seed=3), 40)
    assert batch_statistics(batches)["max_batch_tokens"] <= 256
    rows = [tuple(ids[m]) for f, _ in batches
            for ids, m in zip(f["encoder_token_ids"], f["encoder_padding_mask"])]
    joined = [r for r in rows if r not in sources]
    assert all(any(r[:i] in sources and r[i:] in sources for i in range(1, len(r)))
               for r in joined)
    assert len(joined) > len(rows) / 2
    for features, labels in batches:
        dec, mask = features["decoder_token_ids"], features["decoder_padding_mask"]
        assert mask.sum(axis=1).max() <= 64
        for row, n in enumerate(mask.sum(axis=1)):
            np.testing.assert_array_equal(dec[row, 1:n], labels[row, :n - 1])
            assert dec[row, 0] == tok.bos_id and labels[row, n - 1] == tok.eos_id
            assert tok.eos_id not in labels[row, :n - 1] and tok.bos_id not in dec[row, 1:n]
    again = _take(make_train_dataset(corpus[0], tok, data, seed=3), 40)
    assert _signature(again) == _signature(batches)


def test_training_source_side_is_the_serving_featuriser(corpus, toy_tokenizer, toy_config):
    """A pair kept for training is featurised as evaluation and serving featurise its source."""
    path, pairs = corpus
    data = dataclasses.replace(toy_config.data, max_length=64, token_budget=256)
    served = toy_tokenizer.featurize_source(tf.constant([s for s, _ in pairs]), 64)
    rows = {tuple(r[m]) for r, m in zip(served.token_ids.numpy(), served.padding_mask.numpy())}
    seen = 0
    for features, _ in _take(make_train_dataset(path, toy_tokenizer, data, 0), 20):
        for r, m in zip(features["encoder_token_ids"], features["encoder_padding_mask"]):
            assert tuple(r[m]) in rows
            seen += 1
    assert seen > 20


def _synthetic_examples(num, seed):
    """Lognormal lengths like Bible verses (median ~30 tokens), target ~10% longer."""
    rng = np.random.default_rng(seed)
    src = np.maximum(1, np.round(np.exp(rng.normal(np.log(30), 0.5, num)))).astype(np.int64)
    tgt = np.maximum(1, np.round(src * np.exp(rng.normal(0.1, 0.15, num)))).astype(np.int64) + 1
    keep = np.maximum(src, tgt) <= 128
    src, tgt = src[keep], tgt[keep]

    def example(s, t):
        ones = tf.ones([s], tf.int32)
        dec = tf.ones([t], tf.int32)
        return ({"encoder_token_ids": ones * 5, "encoder_padding_mask": ones > 0,
                 "decoder_token_ids": dec * 5, "decoder_padding_mask": dec > 0}, dec * 5)

    return tf.data.Dataset.from_tensor_slices((src, tgt)).map(example)


@pytest.mark.parametrize("boundaries,minimum", [
    # Every 4 tokens up to 32, every 8 up to 128: the boundaries recommended for the presets.
    ((8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128), 0.90),
    # The current DataConfig default (coarser above 48 tokens).
    ((8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128), 0.88),
])
def test_padding_efficiency_on_verse_like_lengths(boundaries, minimum):
    batches = _synthetic_examples(12000, 0).apply(
        batch_by_token_budget(effective_boundaries(boundaries, 128), 4096, pad_id=0))
    stats = batch_statistics(batches)
    assert stats["max_batch_tokens"] <= 4096
    assert stats["padding_efficiency"] >= minimum, stats
    assert stats["shapes"] <= 2 * len(boundaries) * 3  # a small fixed set of shapes


def test_bad_inputs(tmp_path, toy_tokenizer, toy_config):
    with pytest.raises(FileNotFoundError, match="aiayn data"):
        make_train_dataset(tmp_path / "missing.tsv", toy_tokenizer, toy_config.data)
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\n\nno tab\n", encoding="utf-8")
    # The counting pass names the file and line (the blank line 2 is skipped, not an error)...
    with pytest.raises(UserInputError, match=r"bad\.tsv:3: expected `source<TAB>target` with "
                                             r"exactly one tab, found 0"):
        make_train_dataset(bad, toy_tokenizer, toy_config.data)
    # ... and the featuriser still asserts in the graph.
    with pytest.raises(tf.errors.InvalidArgumentError, match="exactly one tab"):
        next(iter(tf.data.TextLineDataset(str(bad)).apply(featurize_pairs(toy_tokenizer))))
    with pytest.raises(ValueError, match="token_budget"):
        batch_by_token_budget((8, 16), 10, pad_id=0)
    with pytest.raises(ValueError, match="strictly increasing"):
        batch_by_token_budget((16, 8), 100, pad_id=0)
    assert effective_boundaries((8, 16, 64), 32) == (8, 16, 32)
    assert dataset_lib.TOKENIZE_BATCH_SIZE > 1


# --- the length filter's counts, and no pair fitting --------------------------------------------

SHORT = [("I love you.", "Te amo."), ("Jesus wept.", "Jesús lloró."),
         ("Peace be with you.", "La paz sea con vosotros."), ("我爱你", "我爱你")]
LONG_SOURCE = " ".join(["In the beginning God created the heavens and the earth."] * 4)
LONG_TARGET = " ".join(["En el principio creó Dios los cielos y la tierra."] * 4)
LONG = [(LONG_SOURCE, "Te amo."), ("I love you.", LONG_TARGET), (LONG_SOURCE, LONG_TARGET)]


def _write_tsv(path, pairs, prefix=""):
    path.write_text(prefix + "".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def _expected_counts(tokenizer, pairs, max_length):
    src = [len(r) for r in tokenizer.tokenize([s for s, _ in pairs]).to_list()]
    tgt = [len(r) + 1 for r in tokenizer.tokenize([t for _, t in pairs]).to_list()]
    kept = sum(1 <= s <= max_length and t <= max_length for s, t in zip(src, tgt))
    empty = sum(s == 0 for s in src)
    return dict(pairs=len(pairs), kept=kept, dropped_empty=empty,
                dropped_too_long=len(pairs) - kept - empty,
                shortest_pair=min(map(max, src, tgt)), longest_pair=max(map(max, src, tgt)),
                longest_source=max(src), longest_target=max(tgt))


def test_length_filter_counts_are_exact(tmp_path, toy_tokenizer, toy_config):
    # 4 short pairs, 3 too long (source, target, both), 1 whose source has no token; a blank
    # line (skipped, as training skips it) and a byte order mark on the first line.
    pairs = SHORT + LONG + [("   \u200b", "Vacío.")]
    path = tmp_path / "train.tsv"
    path.write_text("\ufeff" + "".join(f"{s}\t{t}\n" for s, t in pairs[:4]) + "\n"
                    + "".join(f"{s}\t{t}\n" for s, t in pairs[4:]), encoding="utf-8")
    data = dataclasses.replace(toy_config.data, max_length=16)
    counts = length_filter_counts(path, toy_tokenizer, data)
    expected = _expected_counts(toy_tokenizer, pairs, 16)
    assert {k: counts[k] for k in expected} == expected
    assert (counts["pairs"], counts["kept"], counts["dropped_too_long"],
            counts["dropped_empty"]) == (8, 4, 3, 1)
    assert counts["max_length"] == 16 and counts["files"] == [str(path)]
    # Exactly what the training pipeline's filter keeps: every kept source shows up, and the
    # first one without the byte order mark.
    examples = tf.data.TextLineDataset(str(path)).apply(featurize_pairs(toy_tokenizer)).apply(
        dataset_lib.filter_by_length(16))
    sources = [tuple(f["encoder_token_ids"].numpy()) for f, _ in examples]
    assert len(sources) == counts["kept"]
    assert sources[0] == tuple(toy_tokenizer.tokenize(["I love you."]).to_list()[0])
    # Several files add up.
    other = _write_tsv(tmp_path / "more.tsv", SHORT[:2])
    both = length_filter_counts([path, other], toy_tokenizer, data)
    assert (both["pairs"], both["kept"]) == (10, 6)


def _in_thread(fn, timeout=120.0):
    """Runs fn in a daemon thread: (finished, result or exception). A hang cannot hang the suite."""
    out = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as err:  # noqa: B036 (handed back to the test)
            out["result"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), out.get("result")


def test_no_pair_fits_max_length_fails_at_once(tmp_path, toy_tokenizer, toy_config):
    path = _write_tsv(tmp_path / "train.tsv", LONG)
    data = dataclasses.replace(toy_config.data, max_length=16)
    finished, result = _in_thread(lambda: next(iter(make_train_dataset(path, toy_tokenizer,
                                                                       data))))
    assert finished, "make_train_dataset hangs when no pair fits data.max_length"
    assert isinstance(result, UserInputError), result
    counts = length_filter_counts(path, toy_tokenizer, data)
    message = str(result)
    assert "No training pair fits data.max_length=16" in message
    assert f"all 3 pairs of {path} are dropped (3 too long" in message
    assert (f"range from {counts['shortest_pair']} to {counts['longest_pair']}. Raise "
            f"data.max_length to at least {counts['shortest_pair']}") in message
    assert counts["shortest_pair"] > 16


def test_empty_training_file_fails_at_once(tmp_path, toy_tokenizer, toy_config):
    path = tmp_path / "train.tsv"
    path.write_text("\n", encoding="utf-8")
    finished, result = _in_thread(lambda: make_train_dataset(path, toy_tokenizer,
                                                             toy_config.data))
    assert finished and isinstance(result, UserInputError), result
    assert "holds no sentence pairs" in str(result) and "aiayn data" in str(result)
