"""Layers: masks, sinusoids, attention, encoder/decoder blocks, config round trips."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from aiayn.models.attention import MultiHeadAttention
from aiayn.models.decoder import TransformerDecoder, TransformerDecoderLayer
from aiayn.models.embedding import TransformerEmbedding, sinusoidal_table
from aiayn.models.encoder import TransformerEncoder, TransformerEncoderLayer
from aiayn.models.feedforward import FeedForward
from aiayn.models.masks import causal_mask, mask_value, merge_masks, self_attention_mask


def test_causal_mask_is_exact_lower_triangle():
    got = ops.convert_to_numpy(causal_mask(4))
    np.testing.assert_array_equal(got, np.tril(np.ones((4, 4), bool)))
    # Offset queries (cached decoding): query 0 is position 2 of a 5-slot cache.
    got = ops.convert_to_numpy(causal_mask(2, 5, query_offset=2))
    np.testing.assert_array_equal(got, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])


def test_merge_masks_and_self_attention_mask():
    pad = np.array([[True, True, False]])
    got = ops.convert_to_numpy(self_attention_mask(pad, causal=True))
    np.testing.assert_array_equal(got[0], [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    assert merge_masks(None, None) is None


def test_mask_value_fits_dtype():
    assert mask_value("float16") > -65504
    assert mask_value("float32") <= -1e9
    with pytest.raises(ValueError, match="floating dtype"):
        mask_value("int32")


def test_sinusoidal_table_known_values():
    table = ops.convert_to_numpy(sinusoidal_table(50, 16))
    assert table.shape == (50, 16)
    np.testing.assert_allclose(table[0, 0::2], 0.0, atol=1e-7)  # sin(0)
    np.testing.assert_allclose(table[0, 1::2], 1.0, atol=1e-7)  # cos(0)
    for pos, i in [(1, 0), (7, 3), (49, 5)]:
        angle = pos / 10000 ** (2 * i / 16)
        np.testing.assert_allclose(table[pos, 2 * i], math.sin(angle), atol=1e-5)
        np.testing.assert_allclose(table[pos, 2 * i + 1], math.cos(angle), atol=1e-5)
    shifted = ops.convert_to_numpy(sinusoidal_table(3, 16, start=7))
    np.testing.assert_allclose(shifted, table[7:10], atol=1e-5)
    with pytest.raises(ValueError, match="even `dim`"):
        sinusoidal_table(4, 15)


def test_embedding_scale_and_dropout_only_in_training():
    keras.utils.set_random_seed(0)
    layer = TransformerEmbedding(10, 16, dropout=0.5)
    ids = np.array([[1, 2, 3]])
    out = ops.convert_to_numpy(layer(ids))
    expected = (ops.convert_to_numpy(layer.embeddings)[ids[0]] * 4.0
                + ops.convert_to_numpy(sinusoidal_table(3, 16)))
    np.testing.assert_allclose(out[0], expected, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(layer(ids, training=False)), out)
    assert not np.allclose(ops.convert_to_numpy(layer(ids, training=True)), out)


def test_token_dropout_zeroes_whole_token_embeddings_and_keeps_their_positions():
    keras.utils.set_random_seed(1)
    layer = TransformerEmbedding(50, 16, token_dropout=0.3)
    ids = np.random.default_rng(0).integers(1, 50, size=(64, 32))
    positions = ops.convert_to_numpy(sinusoidal_table(32, 16))[None]
    tokens = ops.convert_to_numpy(layer(ids, training=False)) - positions
    np.testing.assert_allclose(tokens, ops.convert_to_numpy(layer.embeddings)[ids] * 4.0,
                               atol=1e-5)  # inference: the identity
    kept = ops.convert_to_numpy(layer(ids, training=True)) - positions
    dropped = np.all(np.abs(kept) < 1e-6, axis=-1)  # (64, 32): one draw per token
    assert np.array_equal(np.any(np.abs(kept) < 1e-6, axis=-1), dropped)  # all or nothing
    assert abs(dropped.mean() - 0.3) < 0.03  # 2,048 tokens: the binomial's std is 0.01
    np.testing.assert_allclose(kept[~dropped], tokens[~dropped] / 0.7, rtol=1e-4, atol=1e-5)
    assert [tuple(w.shape) for w in layer.weights] == [(50, 16)]  # no weights of its own
    assert TransformerEmbedding(50, 16).token_dropout_layer is None  # 0 (the paper): no layer


def test_attention_errors_name_expected_and_received():
    with pytest.raises(ValueError, match=r"must divide `hidden_dim`.*hidden_dim=16, num_heads=3"):
        MultiHeadAttention(hidden_dim=16, num_heads=3)
    with pytest.raises(ValueError, match="even"):
        TransformerEmbedding(10, 15)


def test_attention_masks_keys_and_returns_weights():
    keras.utils.set_random_seed(0)
    mha = MultiHeadAttention(16, 2)
    x = keras.random.normal((2, 4, 16))
    mask = self_attention_mask(np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool))
    out, weights = mha.call_with_weights(x, attention_mask=mask)
    assert tuple(out.shape) == (2, 4, 16)
    weights = ops.convert_to_numpy(weights)
    assert weights.shape == (2, 2, 4, 4) and weights.dtype == np.float32
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    assert np.all(weights[0, :, :, 3] == 0) and np.all(weights[1, :, :, 2:] == 0)


def test_attention_symbolic_shapes_with_none_dims():
    mha = MultiHeadAttention(16, 2, self_attention=False)
    q = keras.KerasTensor((None, None, 16))
    v = keras.KerasTensor((None, None, 16))
    assert tuple(mha.compute_output_spec(q, v).shape) == (None, None, 16)


@pytest.mark.parametrize("layer", [
    MultiHeadAttention(16, 2, dropout=0.1, self_attention=False, use_bias=False, name="mha"),
    FeedForward(16, 32, activation="gelu", name="ffn"),
    FeedForward(16, 32, activation="swiglu", name="gated_ffn"),
    TransformerEmbedding(10, 16, dropout=0.2, name="emb"),
    TransformerEmbedding(10, 16, dropout=0.2, token_dropout=0.1, name="word_dropout_emb"),
    TransformerEncoderLayer(16, 32, 2, 0.2, 0.1, True, 1e-5, name="enc_layer"),
    TransformerDecoderLayer(16, 32, 2, 0.2, 0.1, True, 1e-5, name="dec_layer"),
    TransformerEncoder(2, 16, 32, 2, 0.2, 0.1, True, 1e-5, name="encoder"),
    TransformerDecoder(2, 16, 32, 2, 0.2, 0.1, True, 1e-5, name="decoder"),
    TransformerEncoder(2, 16, 32, 2, 0.2, 0.1, True, 1e-5, "geglu", name="geglu_encoder"),
    TransformerDecoder(2, 16, 32, 2, 0.2, 0.1, True, 1e-5, "swiglu", name="swiglu_decoder"),
])
def test_layer_config_round_trip(layer):
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    for key, value in config.items():  # every constructor argument is a public attribute
        if key not in ("name", "trainable", "dtype"):
            assert getattr(layer, key) == value, key
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)


@pytest.mark.parametrize("activation,gate", [("relu", None), ("gelu", None),
                                             ("swiglu", "silu"), ("geglu", "gelu")])
def test_feed_forward_values_equal_numpy(activation, gate):
    erf = np.vectorize(math.erf)
    keras.utils.set_random_seed(3)
    ffn = FeedForward(4, 6, activation=activation)
    ffn.build()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4)).astype("float32")
    for v in ffn.weights:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    w1, b1 = (ops.convert_to_numpy(v) for v in ffn.intermediate_dense.weights)
    w2, b2 = (ops.convert_to_numpy(v) for v in ffn.output_dense.weights)
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    gelu = lambda z: 0.5 * z * (1 + erf(z / np.sqrt(2)))  # noqa: E731
    act = {"relu": lambda z: np.maximum(z, 0), "gelu": gelu, "silu": silu}
    h = x @ w1 + b1
    # Gated: one (4, 12) kernel, the gate's 6 columns first, then the linear half's.
    assert w1.shape == (4, 12 if gate else 6)
    inner = act[gate](h[..., :6]) * h[..., 6:] if gate else act[activation](h)
    np.testing.assert_allclose(ops.convert_to_numpy(ffn(x)), inner @ w2 + b2,
                               rtol=1e-5, atol=1e-5)


def test_feed_forward_rejects_an_unknown_activation_naming_the_choices():
    with pytest.raises(ValueError, match=r"`ffn_activation` must be one of relu, gelu, "
                                         r"swiglu, geglu\. Received: 'glu'"):
        FeedForward(4, 6, activation="glu")


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_cached_steps_equal_full_pass(norm_first):
    keras.utils.set_random_seed(0)
    decoder = TransformerDecoder(2, 16, 32, 2, dropout=0.1, norm_first=norm_first)
    decoder.build()
    x = keras.random.normal((2, 5, 16))
    memory = keras.random.normal((2, 3, 16))
    memory_mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
    full = ops.convert_to_numpy(decoder(x, memory, encoder_padding_mask=memory_mask))
    cache = decoder.init_cache(2, 5)
    cross = decoder.cross_cache(memory)
    steps = []
    for i in range(5):
        out, cache = decoder.call_cached(x[:, i:i + 1], cache, cross, i, memory_mask)
        steps.append(ops.convert_to_numpy(out)[:, 0])
    np.testing.assert_allclose(np.stack(steps, 1), full, atol=1e-5)
