"""LayerNorm: Keras's LayerNormalization with a hand-written training gradient."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from models_helpers import make_batch, make_model

from aiayn.models import layer_norm
from aiayn.models.layer_norm import LayerNorm


@pytest.fixture
def policy_scope():
    yield
    keras.config.set_dtype_policy("float32")


def _pair(policy, d=16, seed=0):
    keras.config.set_dtype_policy(policy)
    rng = np.random.default_rng(seed)
    ours, theirs = LayerNorm(epsilon=1e-6), keras.layers.LayerNormalization(epsilon=1e-6)
    for layer in (ours, theirs):
        layer.build((None, None, d))
        layer.gamma.assign(rng.normal(size=d).astype("float32"))
        layer.beta.assign(rng.normal(size=d).astype("float32"))
        rng = np.random.default_rng(seed)  # the same weights in both
    return ours, theirs


def _value_and_gradients(layer, x, upstream, training):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)
        loss = tf.reduce_sum(tf.cast(y, "float32") * upstream)
    return [y, *tape.gradient(loss, [x, layer.gamma, layer.beta])]


@pytest.mark.parametrize("policy, atol", [("float32", 2e-5), ("mixed_bfloat16", 2e-2)])
@pytest.mark.parametrize("compiled", [False, True])
def test_training_values_and_gradients_equal_keras(policy_scope, policy, atol, compiled):
    ours, theirs = _pair(policy)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(3, 5, 16)) * 3 + 1, dtype=ours.compute_dtype)
    upstream = tf.constant(rng.normal(size=(3, 5, 16)), dtype="float32")
    run = tf.function(_value_and_gradients) if compiled else _value_and_gradients
    got = run(ours, x, upstream, True)
    want = run(theirs, x, upstream, True)
    if not compiled:  # Keras's forward ops (in a graph, grappler may rewrite either one)
        np.testing.assert_array_equal(np.float32(got[0]), np.float32(want[0]))
    for name, a, b in zip(("value", "d_x", "d_gamma", "d_beta"), got, want):
        assert a.dtype == b.dtype, name  # d_x in the input's dtype, d_gamma/d_beta float32
        np.testing.assert_allclose(np.float32(a), np.float32(b), atol=atol, rtol=atol,
                                   err_msg=name)
    assert got[1].dtype == x.dtype


def test_gradient_matches_numpy_closed_form():
    ours, _ = _pair("float32", d=6)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, 6))
    upstream = rng.normal(size=(4, 6))
    _, dx, dgamma, dbeta = _value_and_gradients(ours, tf.constant(x, "float32"),
                                                tf.constant(upstream, "float32"), True)
    gamma = ours.gamma.numpy().astype("float64")
    xhat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    g = upstream * gamma
    want_dx = (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)) \
        / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(dx.numpy(), want_dx, atol=1e-5)
    np.testing.assert_allclose(dgamma.numpy(), (upstream * xhat).sum(0), atol=1e-5)
    np.testing.assert_allclose(dbeta.numpy(), upstream.sum(0), atol=1e-5)


def test_inference_is_exactly_keras_layer_normalization(policy_scope):
    ours, theirs = _pair("float32")
    x = np.random.default_rng(3).normal(size=(2, 3, 16)).astype("float32")
    for training in (False, None):
        np.testing.assert_array_equal(ops.convert_to_numpy(ours(x, training=training)),
                                      ops.convert_to_numpy(theirs(x)))


def test_weights_and_config_are_keras_layer_normalizations():
    ours, theirs = _pair("float32")
    assert [w.path for w in ours.weights] == [w.path.replace("layer_normalization", "layer_norm")
                                              for w in theirs.weights]
    config = ours.get_config()
    assert {k: v for k, v in config.items() if k != "name"} == \
        {k: v for k, v in theirs.get_config().items() if k != "name"}
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(ours))
    assert type(restored) is LayerNorm and restored.epsilon == 1e-6


def test_rejects_other_axes():
    with pytest.raises(ValueError, match=r"last axis only\. Received: axis=1"):
        LayerNorm(axis=1)


@pytest.mark.parametrize("norm_first, norms", [(False, 2 * 2 + 2 * 3), (True, 2 * 2 + 2 * 3 + 2)])
def test_every_norm_of_the_model_trains_through_it(monkeypatch, norm_first, norms):
    """Each of the model's norms (the final ones of pre-norm too) takes the hand-written gradient
    in training, and the model's gradients equal those of Keras's own computation."""
    model = make_model(dropout=0.0, norm_first=norm_first)
    features = make_batch()

    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(features, training=True)))
        return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]

    calls = []
    original = layer_norm._normalize_with_gradient
    monkeypatch.setattr(layer_norm, "_normalize_with_gradient",
                        lambda *args: calls.append(1) or original(*args))
    ours = gradients()
    assert len(calls) == norms
    monkeypatch.setattr(LayerNorm, "call",
                        lambda self, inputs, training=None:
                        keras.layers.LayerNormalization.call(self, inputs))
    theirs = gradients()
    for a, b, variable in zip(ours, theirs, model.trainable_variables):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=variable.path)
