"""Encoder stack (§3.1): N layers of self-attention and feed-forward sub-layers."""

from __future__ import annotations

import keras

from aiayn.models.attention import MultiHeadAttention
from aiayn.models.dropout import Dropout
from aiayn.models.feedforward import FeedForward
from aiayn.models.layer_norm import LayerNorm
from aiayn.models.masks import self_attention_mask


def residual_sublayer(x, sublayer, dropout, norm, norm_first, training):
    """One sub-layer with its residual connection and LayerNorm (§3.1, §5.4).

    Post-norm (the paper): ``LayerNorm(x + Dropout(Sublayer(x)))``.
    Pre-norm (``norm_first``): ``x + Dropout(Sublayer(LayerNorm(x)))``.

    Args:
      x: ``(batch_size, seq_len, hidden_dim)``.
      sublayer: callable ``h -> (y, extra)`` with ``y`` shaped like ``h``.
      dropout, norm: the sub-layer's Dropout and LayerNormalization layers.

    Returns:
      ``(output, extra)``.
    """
    y, extra = sublayer(norm(x, training=training) if norm_first else x)
    y = x + dropout(y, training=training)
    return (y if norm_first else norm(y, training=training)), extra


def _norm(name, epsilon, dtype):
    return LayerNorm(epsilon=epsilon, dtype=dtype, name=name)


@keras.saving.register_keras_serializable(package="aiayn")
class TransformerEncoderLayer(keras.layers.Layer):
    """Self-attention then feed-forward, each wrapped by :func:`residual_sublayer` (§3.1).

    Args:
      hidden_dim: d_model.
      intermediate_dim: d_ff.
      num_heads: h.
      dropout: P_drop on each sub-layer output (§5.4).
      attention_dropout: dropout on the attention weights.
      norm_first: pre-norm instead of the paper's post-norm.
      layer_norm_epsilon: LayerNorm epsilon.
      ffn_activation: the feed-forward network's activation (:class:`FeedForward`).

    Call args:
      x: ``(batch_size, src_len, hidden_dim)``.
      padding_mask: bool ``(batch_size, src_len)``, True on real tokens.
      training: enables dropout.

    Returns:
      ``(batch_size, src_len, hidden_dim)``.
    """

    def __init__(self, hidden_dim, intermediate_dim, num_heads, dropout=0.1,
                 attention_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6,
                 ffn_activation="relu", **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.ffn_activation = ffn_activation
        dt = self.dtype_policy
        self.self_attention = MultiHeadAttention(hidden_dim, num_heads, attention_dropout,
                                                 self_attention=True, dtype=dt,
                                                 name="self_attention")
        self.self_attention_dropout = Dropout(dropout, dtype=dt, name="self_attention_dropout")
        self.self_attention_norm = _norm("self_attention_norm", layer_norm_epsilon, dt)
        self.feed_forward = FeedForward(hidden_dim, intermediate_dim, ffn_activation,
                                        dtype=dt, name="feed_forward")
        self.feed_forward_dropout = Dropout(dropout, dtype=dt, name="feed_forward_dropout")
        self.feed_forward_norm = _norm("feed_forward_norm", layer_norm_epsilon, dt)

    def build(self, input_shape=None):
        shape = (None, None, self.hidden_dim)
        for layer in (self.self_attention, self.self_attention_norm, self.feed_forward,
                      self.feed_forward_norm):
            layer.build(shape)
        self.built = True

    def _forward(self, x, attention_mask, training):
        # §3.1: multi-head self-attention, dropout, residual, norm ...
        x, weights = residual_sublayer(
            x, lambda h: self.self_attention.call_with_weights(
                h, attention_mask=attention_mask, training=training),
            self.self_attention_dropout, self.self_attention_norm, self.norm_first, training)
        # ... then the position-wise feed-forward network, dropout, residual, norm.
        x, _ = residual_sublayer(
            x, lambda h: (self.feed_forward(h), None),
            self.feed_forward_dropout, self.feed_forward_norm, self.norm_first, training)
        return x, weights

    def call(self, x, padding_mask=None, training=None):
        return self._forward(x, self_attention_mask(padding_mask), training)[0]

    def call_with_weights(self, x, padding_mask=None, training=None):
        """Returns ``(output, weights)``; weights float32 ``(batch, heads, src_len, src_len)``."""
        return self._forward(x, self_attention_mask(padding_mask), training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(hidden_dim=self.hidden_dim, intermediate_dim=self.intermediate_dim,
                      num_heads=self.num_heads, dropout=self.dropout,
                      attention_dropout=self.attention_dropout, norm_first=self.norm_first,
                      layer_norm_epsilon=self.layer_norm_epsilon,
                      ffn_activation=self.ffn_activation)
        return config


@keras.saving.register_keras_serializable(package="aiayn")
class TransformerEncoder(keras.layers.Layer):
    """A stack of ``num_layers`` :class:`TransformerEncoderLayer` (§3.1, N = 6 in the paper).

    With ``norm_first`` a final LayerNorm closes the stack (pre-norm outputs are un-normalised).
    Arguments as :class:`TransformerEncoderLayer`, plus ``num_layers``.

    Call args:
      x: embedded source ``(batch_size, src_len, hidden_dim)``.
      padding_mask: bool ``(batch_size, src_len)``.

    Returns:
      ``(batch_size, src_len, hidden_dim)``.
    """

    def __init__(self, num_layers, hidden_dim, intermediate_dim, num_heads, dropout=0.1,
                 attention_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6,
                 ffn_activation="relu", **kwargs):
        super().__init__(**kwargs)
        if num_layers < 1:
            raise ValueError(f"`num_layers` must be at least 1. Received: {num_layers}.")
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.ffn_activation = ffn_activation
        self.encoder_layers = [
            TransformerEncoderLayer(hidden_dim, intermediate_dim, num_heads, dropout,
                                    attention_dropout, norm_first, layer_norm_epsilon,
                                    ffn_activation,
                                    dtype=self.dtype_policy, name=f"layer_{i}")
            for i in range(num_layers)
        ]
        self.final_norm = (_norm("final_norm", layer_norm_epsilon, self.dtype_policy)
                           if norm_first else None)

    def build(self, input_shape=None):
        for layer in self.encoder_layers:
            layer.build((None, None, self.hidden_dim))
        if self.final_norm is not None:
            self.final_norm.build((None, None, self.hidden_dim))
        self.built = True

    def _finish(self, x):
        return self.final_norm(x) if self.final_norm is not None else x

    def call(self, x, padding_mask=None, training=None):
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=padding_mask, training=training)
        return self._finish(x)

    def call_with_weights(self, x, padding_mask=None, training=None):
        """Returns ``(output, [weights of layer i (batch, heads, src_len, src_len)])``."""
        all_weights = []
        for layer in self.encoder_layers:
            x, weights = layer.call_with_weights(x, padding_mask=padding_mask, training=training)
            all_weights.append(weights)
        return self._finish(x), all_weights

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, hidden_dim=self.hidden_dim,
                      intermediate_dim=self.intermediate_dim, num_heads=self.num_heads,
                      dropout=self.dropout, attention_dropout=self.attention_dropout,
                      norm_first=self.norm_first, layer_norm_epsilon=self.layer_norm_epsilon,
                      ffn_activation=self.ffn_activation)
        return config
