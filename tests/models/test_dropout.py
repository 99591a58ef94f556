"""Dropout: Keras's layer with a mask from 16 random bits an element."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from models_helpers import make_model

from aiayn.models.dropout import Dropout, keep_probability, keep_threshold

SHAPE = (64, 34, 256)  # a 2,048-token batch of the small preset


@pytest.fixture
def policy_scope():
    yield
    keras.config.set_dtype_policy("float32")


def test_the_threshold_drops_the_rate_of_the_int16_values():
    assert keep_threshold(0.2) == -32768 + 13107 and keep_threshold(0.0) == -32768
    assert keep_probability(0.2) == 52429 / 65536  # round(0.2 * 65536) = 13107 dropped
    assert keep_probability(0.0) == 1.0 and keep_probability(0.5) == 0.5
    for rate in (0.1, 0.2, 0.3, 0.9):
        assert abs(1 - keep_probability(rate) - rate) <= 2**-17


@pytest.mark.parametrize("rate", [0.1, 0.2, 0.5])
def test_training_drops_the_rate_and_scales_the_kept_elements_exactly(rate):
    x = np.random.default_rng(0).normal(size=SHAPE).astype("float32")
    y = keras.ops.convert_to_numpy(Dropout(rate, seed=3)(x, training=True))
    dropped = y == 0
    # 557,056 elements: the binomial's standard deviation is below 0.0007.
    assert abs(dropped.mean() - rate) < 0.004
    np.testing.assert_allclose(y[~dropped], x[~dropped] / keep_probability(rate), rtol=1e-6)
    # Each position is dropped independently: no row or feature is favoured.
    assert np.abs(dropped.mean(axis=(0, 1)) - rate).max() < 0.08
    assert np.abs(dropped.mean(axis=(0, 2)) - rate).max() < 0.03


def test_inference_and_rate_zero_are_the_identity_and_masks_differ_between_calls():
    x = np.random.default_rng(1).normal(size=(4, 6, 8)).astype("float32")
    layer = Dropout(0.3, seed=5)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x, training=False)), x)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(Dropout(0.0)(x, training=True)), x)
    first, second = (keras.ops.convert_to_numpy(layer(x, training=True)) for _ in range(2))
    assert not np.array_equal(first == 0, second == 0)  # the seed generator advances
    again = keras.ops.convert_to_numpy(Dropout(0.3, seed=5)(x, training=True))
    np.testing.assert_array_equal(again, first)  # a seed fixes the sequence


def test_the_gradient_is_the_mask_times_the_scale():
    x = tf.constant(np.random.default_rng(2).normal(size=(8, 5, 16)).astype("float32"))
    layer = Dropout(0.25, seed=7)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
    grad = tape.gradient(y, x).numpy()
    kept = y.numpy() != 0
    np.testing.assert_allclose(grad, kept / keep_probability(0.25), rtol=1e-6)


def test_bfloat16_and_keras_fallbacks(policy_scope):
    keras.config.set_dtype_policy("mixed_bfloat16")
    x = np.ones((16, 8, 32), "float32")
    y = Dropout(0.2, seed=1)(x, training=True)
    assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
    y = keras.ops.convert_to_numpy(keras.ops.cast(y, "float32"))
    assert set(np.unique(y)) == {0.0, np.float32(tf.bfloat16.as_numpy_dtype(1 / 0.8))}
    keras.config.set_dtype_policy("float32")
    # An odd last axis and a noise shape take Keras's mask (still dropout at the rate).
    odd = keras.ops.convert_to_numpy(Dropout(0.5, seed=1)(np.ones((64, 33), "float32"),
                                                          training=True))
    assert 0.4 < (odd == 0).mean() < 0.6 and set(np.unique(odd)) == {0.0, 2.0}
    shared = keras.ops.convert_to_numpy(
        Dropout(0.5, noise_shape=(64, 1), seed=1)(np.ones((64, 32), "float32"), training=True))
    assert all(len(set(row)) == 1 for row in shared)


def test_config_round_trips_and_the_model_uses_it_everywhere():
    layer = Dropout(0.2, seed=9, name="d")
    clone = Dropout.from_config(layer.get_config())
    assert type(clone) is Dropout and clone.rate == 0.2 and clone.seed == 9
    assert layer.get_config() == keras.layers.Dropout(0.2, seed=9, name="d").get_config()
    model = make_model(dropout=0.1, attention_dropout=0.1, token_dropout=0.1)
    dropouts = [layer for layer in model._flatten_layers()
                if isinstance(layer, keras.layers.Dropout)]
    assert dropouts and all(type(layer) is Dropout for layer in dropouts)
    # Word dropout is one of them (so late dropout switches it too), one draw a token.
    words = [layer for layer in dropouts if layer.name == "token_dropout"]
    assert len(words) == 1 and words[0].rate == 0.1 and words[0].noise_shape == (None, None, 1)
