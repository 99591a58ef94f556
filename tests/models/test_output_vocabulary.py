"""A decoder restricted to an output vocabulary (``Transformer(output_ids=...)``): the training
logits are the whole vocabulary's at those columns, the loss reads labels as columns, decoding
never leaves the set, and the weights (so checkpoints) are those of the unrestricted model."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from models_helpers import BOS, EOS, PAD, TINY, VOCAB, make_batch, make_model

from aiayn.models.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from aiayn.models.transformer import Transformer
from aiayn.pipeline.training.fused_adam import FusedAdam

# The specials and 22 ordinary ids: 14 of the 40 ids are never produced.
OUTPUT_IDS = list(range(24)) + [30, 35]
OUTSIDE = sorted(set(range(VOCAB)) - set(OUTPUT_IDS))


def _np(x):
    return ops.convert_to_numpy(x)


@pytest.mark.parametrize("tied", [True, False])
def test_training_logits_are_the_full_logits_at_the_output_columns(tied):
    full = make_model(tie_embeddings=tied, dropout=0.0)
    restricted = make_model(tie_embeddings=tied, dropout=0.0, output_ids=OUTPUT_IDS)
    assert [w.shape for w in restricted.weights] == [w.shape for w in full.weights]
    features = make_batch()
    expected = _np(full(features, training=False))[..., OUTPUT_IDS]
    got = _np(restricted(features, training=True))
    assert got.shape == (3, 6, len(OUTPUT_IDS))
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_loss_and_accuracy_read_labels_as_columns_and_skip_labels_outside():
    rng = np.random.default_rng(0)
    ids = [0, 2, 3, 5, 8]
    logits = rng.normal(size=(2, 4, len(ids))).astype("float32")
    labels = np.array([[5, 8, 3, 0], [2, 7, 0, 0]])  # 7 is outside the output ids
    eps = 0.1
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    column = {token: j for j, token in enumerate(ids)}
    scored = [(b, t) for b in range(2) for t in range(4) if labels[b, t] in column
              and labels[b, t] != 0]
    per_token = [-(1 - eps) * logp[b, t, column[labels[b, t]]] - eps * logp[b, t].mean()
                 for b, t in scored]
    loss = MaskedLabelSmoothedCrossEntropy(eps, pad_id=0, output_ids=ids)
    np.testing.assert_allclose(float(loss(labels, logits)), np.mean(per_token), rtol=1e-5)
    accuracy = MaskedAccuracy(pad_id=0, output_ids=ids)
    accuracy.update_state(labels, logits)
    right = [logits[b, t].argmax() == column[labels[b, t]] for b, t in scored]
    assert (float(accuracy.correct), float(accuracy.count)) == (float(sum(right)), 4.0)
    for obj in (loss, accuracy):
        clone = obj.__class__.from_config(obj.get_config())
        assert clone.get_config() == obj.get_config() and clone.output_ids == ids


def test_generate_never_produces_an_id_outside_and_all_ids_change_nothing():
    model = make_model(dropout=0.0)
    features = make_batch(batch=4, seed=3)
    args = (features["encoder_token_ids"], features["encoder_padding_mask"], BOS, EOS)
    # Make the ids outside the set the likeliest outputs of the unrestricted model.
    table = model.embedding.embeddings
    boosted = _np(table).copy()
    boosted[OUTSIDE] *= 8.0
    table.assign(boosted)
    free = _np(model.generate(*args, beam_size=3, max_extra_length=6)["token_ids"])
    assert np.isin(free, OUTSIDE).any()
    restricted = make_model(dropout=0.0, output_ids=OUTPUT_IDS)
    restricted.set_weights(model.get_weights())
    for beam, dynamic in ((1, False), (3, False), (3, True)):
        out = _np(restricted.generate(*args, beam_size=beam, max_extra_length=6,
                                      dynamic_shapes=dynamic)["token_ids"])
        assert not np.isin(out, OUTSIDE).any(), (beam, dynamic)
    everything = make_model(dropout=0.0, output_ids=list(range(VOCAB)))
    everything.set_weights(model.get_weights())
    same = everything.generate(*args, beam_size=3, max_extra_length=6)
    np.testing.assert_array_equal(_np(same["token_ids"]), free)


def test_the_search_over_output_columns_is_the_full_search_with_the_rest_impossible():
    # Untied, so an output bias of -1e9 makes the ids outside impossible in the full model:
    # its translations and scores are then the restricted model's, which searches over the
    # output columns only and maps them back to ids.
    full = make_model(dropout=0.0, tie_embeddings=False)
    bias = _np(full.output_projection.bias).copy()
    bias[OUTSIDE] = -1e9
    full.output_projection.bias.assign(bias)
    restricted = make_model(dropout=0.0, tie_embeddings=False, output_ids=OUTPUT_IDS)
    restricted.set_weights(full.get_weights())
    features = make_batch(batch=4, seed=5)
    args = (features["encoder_token_ids"], features["encoder_padding_mask"], BOS, EOS)
    for beam, dynamic in ((1, False), (3, False), (3, True)):
        want = full.generate(*args, beam_size=beam, n_best=beam, max_extra_length=6,
                             dynamic_shapes=dynamic)
        got = restricted.generate(*args, beam_size=beam, n_best=beam, max_extra_length=6,
                                  dynamic_shapes=dynamic)
        np.testing.assert_array_equal(_np(got["token_ids"]), _np(want["token_ids"]))
        np.testing.assert_array_equal(_np(got["lengths"]), _np(want["lengths"]))
        np.testing.assert_allclose(_np(got["scores"]), _np(want["scores"]), atol=1e-4)


def test_one_fused_adam_step_moves_the_output_rows_and_no_unused_row_outside():
    model = make_model(dropout=0.0, output_ids=OUTPUT_IDS)
    features = make_batch()
    labels = np.where(features["decoder_padding_mask"],
                      np.roll(features["decoder_token_ids"], -1, axis=1), PAD)
    labels = np.where(np.isin(labels, OUTSIDE), 4, labels)
    model.compile(optimizer=FusedAdam(1e-2),
                  loss=MaskedLabelSmoothedCrossEntropy(0.1, PAD, output_ids=OUTPUT_IDS),
                  metrics=[MaskedAccuracy(PAD, output_ids=OUTPUT_IDS)])
    before = _np(model.embedding.embeddings).copy()
    history = model.fit(tf.data.Dataset.from_tensors((features, labels)), verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = _np(model.embedding.embeddings)
    # Every output row moves (the softmax pushes on each); a row outside that no input uses,
    # none.
    inputs = set(np.unique(features["encoder_token_ids"])) | set(
        np.unique(features["decoder_token_ids"]))
    untouched = [i for i in OUTSIDE if i not in inputs]
    assert untouched and np.array_equal(after[untouched], before[untouched])
    assert not np.isclose(after[OUTPUT_IDS[4:]], before[OUTPUT_IDS[4:]]).all(axis=1).any()


def test_config_and_keras_file_round_trip_keep_the_output_ids(tmp_path):
    model = make_model(output_ids=OUTPUT_IDS)
    config = model.get_config()
    assert config["output_ids"] == OUTPUT_IDS
    assert Transformer.from_config(config).output_ids == tuple(OUTPUT_IDS)
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    features = make_batch()
    np.testing.assert_allclose(_np(restored(features)), _np(model(features)), atol=1e-6)


@pytest.mark.parametrize("ids", [[0, 2, 1], [0, 0, 3], [0, 3, VOCAB], [-1, 3], []])
def test_output_ids_errors_name_the_rule(ids):
    with pytest.raises(ValueError, match="ascending and unique"):
        Transformer(vocabulary_size=VOCAB, pad_id=PAD, output_ids=ids, **TINY)


def test_generate_refuses_special_ids_outside_the_output_ids():
    model = make_model(output_ids=[0, 1, 2, 4, 5])
    features = make_batch()
    with pytest.raises(ValueError, match="`eos_id` 3 not among the model's `output_ids`"):
        model.generate(features["encoder_token_ids"], features["encoder_padding_mask"], BOS,
                       EOS)
