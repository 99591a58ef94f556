"""The Transformer model: invariances, cached decoding, sizes, serialisation, precision, fit."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from models_helpers import BOS, EOS, PAD, TINY, VOCAB, make_batch, make_model

from aiayn.models.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from aiayn.models.schedule import BudgetSchedule, TransformerSchedule
from aiayn.models.transformer import Transformer
from aiayn.pipeline.config import load_config


def _logits(model, features, **kwargs):
    return ops.convert_to_numpy(model(features, training=False, **kwargs))


def test_output_shape_and_dtype(tiny_model):
    logits = tiny_model(make_batch(), training=False)
    assert tuple(logits.shape) == (3, 6, VOCAB) and logits.dtype == "float32"


def test_padding_invariance(tiny_model):
    features = make_batch()
    changed = {k: v.copy() for k, v in features.items()}
    for ids, mask in (("encoder_token_ids", "encoder_padding_mask"),
                      ("decoder_token_ids", "decoder_padding_mask")):
        changed[ids] = np.where(changed[mask], changed[ids], 17)  # other pad tokens
    a, b = _logits(tiny_model, features), _logits(tiny_model, changed)
    real = features["decoder_padding_mask"]
    np.testing.assert_allclose(a[real], b[real], atol=1e-5)


def test_causality(tiny_model):
    features = make_batch(pad_tail=False)
    changed = {k: v.copy() for k, v in features.items()}
    changed["decoder_token_ids"][:, 4:] = 9  # change the future
    a, b = _logits(tiny_model, features), _logits(tiny_model, changed)
    np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-5)
    assert not np.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True, "tie_embeddings": False},
                                       {"num_layers": 3, "num_decoder_layers": 1}],
                         ids=["post-norm", "pre-norm-untied", "deep-encoder-shallow-decoder"])
def test_cached_decoding_equals_full_forward(overrides):
    model = make_model(**overrides)
    features = make_batch(pad_tail=False)
    full = _logits(model, features)
    memory = model.encoder_memory(
        model.encode(features["encoder_token_ids"], features["encoder_padding_mask"]),
        features["encoder_padding_mask"])
    length = features["decoder_token_ids"].shape[1]
    cache = model.init_cache(3, length + 2)  # a longer cache than needed is fine
    steps = []
    for i in range(length):
        logits, cache = model.decode_step(
            ops.convert_to_tensor(features["decoder_token_ids"][:, i]), cache, i, memory)
        steps.append(ops.convert_to_numpy(logits))
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-5)


def test_dropout_only_in_training(tiny_model):
    features = make_batch()
    a = _logits(tiny_model, features)
    np.testing.assert_allclose(a, _logits(tiny_model, features))
    assert not np.allclose(a, ops.convert_to_numpy(tiny_model(features, training=True)))


def test_attention_weights_for_plots(tiny_model):
    weights = tiny_model.attention_weights(make_batch())
    assert [tuple(w.shape) for w in weights["encoder_self"]] == [(3, 2, 7, 7)] * 2
    assert [tuple(w.shape) for w in weights["decoder_self"]] == [(3, 2, 6, 6)] * 2
    assert [tuple(w.shape) for w in weights["cross"]] == [(3, 2, 6, 7)] * 2
    self_w = ops.convert_to_numpy(weights["decoder_self"][0])
    assert np.all(np.triu(self_w[0, 0], k=1) == 0)  # causal


def test_encoder_and_decoder_depths_differ_where_asked(tmp_path):
    deep_shallow = make_model(num_layers=3, num_decoder_layers=1)
    assert (len(deep_shallow.encoder.encoder_layers),
            len(deep_shallow.decoder.decoder_layers)) == (3, 1)
    weights = deep_shallow.attention_weights(make_batch())
    assert [len(weights[k]) for k in ("encoder_self", "decoder_self", "cross")] == [3, 1, 1]
    assert len(deep_shallow.init_cache(3, 5)["layers"]) == 1  # one decoder layer's cache
    # Against the 2-2 model: one encoder layer more (attention, feed-forward, two norms) and
    # one decoder layer less (the same plus cross-attention and a third norm).
    d, f = TINY["hidden_dim"], TINY["intermediate_dim"]
    encoder_layer = 4 * d * d + 4 * d + 2 * d * f + f + d + 2 * 2 * d
    decoder_layer = encoder_layer + 4 * d * d + 4 * d + 2 * d
    assert (deep_shallow.count_params() - make_model().count_params()
            == encoder_layer - decoder_layer)
    # None and 0 (the config's "as many") both mean the paper's equal depths.
    for same in (None, 0):
        assert make_model(num_decoder_layers=same).num_decoder_layers == TINY["num_layers"]
    config = deep_shallow.get_config()
    assert (config["num_layers"], config["num_decoder_layers"]) == (3, 1)
    path = tmp_path / "deep_shallow.keras"
    deep_shallow.save(path)
    restored = keras.saving.load_model(path)
    assert len(restored.decoder.decoder_layers) == 1
    np.testing.assert_allclose(_logits(restored, make_batch()),
                               _logits(deep_shallow, make_batch()), atol=1e-6)
    # A config saved before the decoder's depth had its own key gets equal depths.
    legacy = {k: v for k, v in make_model().get_config().items() if k != "num_decoder_layers"}
    assert Transformer.from_config(legacy).num_decoder_layers == TINY["num_layers"]


def _param_count(preset):
    cfg = load_config([preset])
    model = Transformer(vocabulary_size=cfg.data.vocab_size, pad_id=0,
                        **dataclasses.asdict(cfg.model))
    model.build()
    return model.count_params()


def test_parameter_counts_base_and_big():
    # Paper Table 3 reports 65M and 213M; with a shared 37000 vocabulary, tied output.
    assert 62e6 < _param_count("base") < 64e6
    assert 211e6 < _param_count("big") < 215e6


def test_constructor_errors():
    with pytest.raises(ValueError, match="must divide `hidden_dim`"):
        Transformer(vocabulary_size=VOCAB, pad_id=PAD, **{**TINY, "num_heads": 3})
    with pytest.raises(ValueError, match="pad_id"):
        Transformer(vocabulary_size=VOCAB, pad_id=VOCAB, **TINY)


def test_config_and_keras_file_round_trip(tmp_path):
    model = make_model(norm_first=True, token_dropout=0.1)
    config = model.get_config()
    assert {k: config[k] for k in TINY} == {**TINY, "norm_first": True}
    assert config["token_dropout"] == 0.1
    clone = Transformer.from_config(config)
    assert clone.get_config() == config
    features = make_batch()
    expected = _logits(model, features)
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_allclose(_logits(restored, features), expected, atol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_float32_logits_and_fully_padded_rows(policy):
    model = make_model(dtype=policy)
    features = make_batch()
    features["encoder_padding_mask"][2] = False  # a fully padded row
    features["decoder_padding_mask"][2] = False
    logits = model(features, training=True)
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(ops.convert_to_numpy(logits)))
    labels = np.where(features["decoder_padding_mask"], features["decoder_token_ids"], PAD)
    loss = MaskedLabelSmoothedCrossEntropy(0.1, PAD)(labels, logits)
    assert np.isfinite(float(loss))
    out = model.generate(features["encoder_token_ids"], features["encoder_padding_mask"],
                         BOS, EOS, beam_size=2, max_extra_length=3)
    assert np.all(np.isfinite(ops.convert_to_numpy(out["scores"])))


def test_loss_is_mean_over_real_tokens_with_label_smoothing():
    logits = np.random.default_rng(0).normal(size=(2, 3, 5)).astype("float32")
    labels = np.array([[1, 2, 0], [4, 0, 0]])
    eps = 0.1
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    per_token = -(1 - eps) * np.take_along_axis(logp, labels[..., None], -1)[..., 0] \
        - eps * logp.mean(-1)
    expected = per_token[labels != 0].mean()
    got = float(MaskedLabelSmoothedCrossEntropy(eps, pad_id=0)(labels, logits))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    acc = MaskedAccuracy(pad_id=0)
    acc.update_state(labels, logits)
    real = labels != 0
    np.testing.assert_allclose(float(acc.result()),
                               (logits.argmax(-1) == labels)[real].mean(), rtol=1e-6)
    # Right means the label's logit is the row's largest; a tie counts as right, padding never.
    tie = MaskedAccuracy(pad_id=0)
    tie.update_state(np.array([[2, 1, 3, 0]]),
                     np.array([[[0, 5, 5, 1], [0, 5, 5, 1], [0, 5, 5, 1], [9, 0, 0, 0]]],
                              "float32"))
    assert (float(tie.correct), float(tie.count)) == (2.0, 3.0)
    # The gradient is the smoothed-target softmax residual on real tokens, zero on padding.
    variable = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = MaskedLabelSmoothedCrossEntropy(eps, pad_id=0)(labels, variable)
    target = (1 - eps) * np.eye(5)[labels] + eps / 5
    expected_grad = (np.exp(logp) - target) * real[..., None] / real.sum()
    np.testing.assert_allclose(tape.gradient(loss, variable).numpy(), expected_grad, atol=1e-6)
    for obj in (MaskedLabelSmoothedCrossEntropy(0.2, 3), MaskedAccuracy(5)):
        clone = obj.__class__.from_config(obj.get_config())
        assert clone.get_config() == obj.get_config()


def test_schedule_matches_formula_and_round_trips():
    schedule = TransformerSchedule(512, warmup_steps=4000, scale=2.0)
    for iteration in (0, 99, 3999, 9999):
        step = iteration + 1
        expected = 2.0 * 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
        np.testing.assert_allclose(float(schedule(iteration)), expected, rtol=1e-5)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert restored.get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="warmup_steps"):
        TransformerSchedule(512, 0)


def test_budget_schedule_warms_up_then_falls_linearly_to_zero_at_the_budget():
    peak = 0.6 * (256 * 500) ** -0.5
    steps_only = BudgetSchedule(256, warmup_steps=500, total_steps=2000, scale=0.6)
    # Iteration i is step i + 1; progress = step / total_steps; decay over the whole run.
    for iteration, expected in ((0, peak / 500), (249, peak * 250 / 500),
                                (499, peak * min(1.0, 1 - 500 / 2000)),
                                (1499, peak * (1 - 1500 / 2000)), (1999, 0.0), (5000, 0.0)):
        np.testing.assert_allclose(float(steps_only(iteration)), expected, rtol=1e-5, atol=1e-12)
    timed = BudgetSchedule(256, warmup_steps=500, total_steps=20000, scale=0.6,
                           decay_fraction=0.8, warmup_fraction=0.2)
    # A time budget: the callback's share of the time, not the steps, sets the shape.
    for share, expected in ((0.1, peak * 0.5), (0.2, peak), (0.6, peak * 0.5), (1.0, 0.0)):
        timed.time_progress.assign(share)
        np.testing.assert_allclose(float(timed(99)), expected, rtol=1e-5, atol=1e-12)
    timed.time_progress.assign(0.0)
    np.testing.assert_allclose(float(timed(499)), peak, rtol=1e-5)  # steps end the warm-up too
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(timed))
    assert restored.get_config() == timed.get_config()
    for bad, match in (({"total_steps": 0}, "total_steps"), ({"decay_fraction": 0.0}, "decay"),
                       ({"warmup_fraction": 1.0}, "warmup_fraction")):
        with pytest.raises(ValueError, match=match):
            BudgetSchedule(**{"hidden_dim": 256, "warmup_steps": 10, "total_steps": 100, **bad})


def test_rsqrt_cooldown_is_the_paper_schedule_until_the_decay_then_falls_to_zero():
    paper = TransformerSchedule(256, warmup_steps=500, scale=0.6)
    cooled = BudgetSchedule(256, warmup_steps=500, total_steps=20000, scale=0.6,
                            decay_fraction=0.25, hold="rsqrt")
    # Before the last quarter of the budget: §5.3's rate, warm-up and inverse square root.
    for iteration, share in ((0, 0.0), (249, 0.01), (499, 0.05), (1999, 0.5), (5999, 0.75)):
        cooled.time_progress.assign(share)
        np.testing.assert_allclose(float(cooled(iteration)), float(paper(iteration)), rtol=1e-5)
    # In it: the paper's rate times the share of the decay left, zero at the end.
    for share, left in ((0.8, 0.8), (0.9, 0.4), (1.0, 0.0), (1.2, 0.0)):
        cooled.time_progress.assign(share)
        np.testing.assert_allclose(float(cooled(5999)), float(paper(5999)) * left, rtol=1e-5,
                                   atol=1e-12)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(cooled))
    assert restored.get_config() == cooled.get_config()
    assert restored.get_config()["hold"] == "rsqrt"
    with pytest.raises(ValueError, match="`hold` must be one of"):
        BudgetSchedule(256, warmup_steps=10, total_steps=100, hold="cosine")


def test_sqrt_decay_shape_halves_the_rate_in_the_first_quarter_of_the_decay():
    paper = TransformerSchedule(256, warmup_steps=500, scale=0.6)
    cooled = BudgetSchedule(256, warmup_steps=500, total_steps=20000, scale=0.6,
                            decay_fraction=0.2, hold="rsqrt", decay_shape="sqrt")
    # Share of the decay elapsed x: the rate is the paper's times 1 - sqrt(x).
    for share, factor in ((0.5, 1.0), (0.79, 1.0), (0.85, 0.5), (0.96, 0.1055728), (1.0, 0.0),
                          (1.3, 0.0)):
        cooled.time_progress.assign(share)
        np.testing.assert_allclose(float(cooled(5999)), float(paper(5999)) * factor, rtol=1e-4,
                                   atol=1e-12)
    peak = 0.6 * (256 * 500) ** -0.5
    trapezoid = BudgetSchedule(256, warmup_steps=500, total_steps=2000, scale=0.6,
                               decay_fraction=0.5, decay_shape="sqrt")
    # Steps end the run; the decay is the last 1,000 steps: x = 0.25 at step 1,250.
    for iteration, expected in ((249, peak * 0.5), (999, peak), (1249, peak * 0.5),
                                (1999, 0.0)):
        np.testing.assert_allclose(float(trapezoid(iteration)), expected, rtol=1e-4, atol=1e-12)
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(trapezoid))
    assert restored.get_config()["decay_shape"] == "sqrt"
    with pytest.raises(ValueError, match="`decay_shape` must be one of"):
        BudgetSchedule(256, warmup_steps=10, total_steps=100, decay_shape="cosine")


def test_one_training_step_under_jit_compile():
    model = make_model()
    features = make_batch()
    labels = np.where(features["decoder_padding_mask"],
                      np.roll(features["decoder_token_ids"], -1, axis=1), PAD)
    model.compile(optimizer=keras.optimizers.Adam(TransformerSchedule(16, 10), beta_2=0.98,
                                                  epsilon=1e-9),
                  loss=MaskedLabelSmoothedCrossEntropy(0.1, PAD),
                  metrics=[MaskedAccuracy(PAD)], jit_compile=True)
    before = [ops.convert_to_numpy(w).copy() for w in model.trainable_weights]
    dataset = tf.data.Dataset.from_tensors((features, labels))
    history = model.fit(dataset, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])
    after = [ops.convert_to_numpy(w) for w in model.trainable_weights]
    assert any(not np.allclose(a, b) for a, b in zip(before, after))
