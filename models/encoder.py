"""Encoder stack (§3.1): N layers of self-attention and feed-forward sub-layers."""

from __future__ import annotations

import keras

from aiayn.models.attention import MultiHeadAttention
from aiayn.models.dropout import Dropout
from aiayn.models.feedforward import FeedForward
from aiayn.models.masks import self_attention_mask
from aiayn.models.stack import (
    TransformerLayerBase,
    TransformerStackBase,
    layer_norm,
    residual_sublayer,
)


@keras.saving.register_keras_serializable(package="aiayn")
class TransformerEncoderLayer(TransformerLayerBase):
    """Self-attention then feed-forward, each wrapped by :func:`residual_sublayer` (§3.1).

    Args: as :class:`aiayn.models.stack.TransformerLayerBase` (d_model, d_ff, h, P_drop, ...).

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
        super().__init__(hidden_dim, intermediate_dim, num_heads, dropout, attention_dropout,
                         norm_first, layer_norm_epsilon, ffn_activation, **kwargs)
        dt = self.dtype_policy
        self.self_attention = MultiHeadAttention(hidden_dim, num_heads, attention_dropout,
                                                 self_attention=True, dtype=dt,
                                                 name="self_attention")
        self.self_attention_dropout = Dropout(dropout, dtype=dt, name="self_attention_dropout")
        self.self_attention_norm = layer_norm("self_attention_norm", layer_norm_epsilon, dt)
        self.feed_forward = FeedForward(hidden_dim, intermediate_dim, ffn_activation,
                                        dtype=dt, name="feed_forward")
        self.feed_forward_dropout = Dropout(dropout, dtype=dt, name="feed_forward_dropout")
        self.feed_forward_norm = layer_norm("feed_forward_norm", layer_norm_epsilon, dt)

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



@keras.saving.register_keras_serializable(package="aiayn")
class TransformerEncoder(TransformerStackBase):
    """A stack of ``num_layers`` :class:`TransformerEncoderLayer` (§3.1, N = 6 in the paper).

    With ``norm_first`` a final LayerNorm closes the stack (pre-norm outputs are un-normalised).
    Arguments as :class:`TransformerEncoderLayer`, plus ``num_layers`` first
    (:class:`aiayn.models.stack.TransformerStackBase`).

    Call args:
      x: embedded source ``(batch_size, src_len, hidden_dim)``.
      padding_mask: bool ``(batch_size, src_len)``.

    Returns:
      ``(batch_size, src_len, hidden_dim)``.
    """

    def __init__(self, num_layers, hidden_dim, intermediate_dim, num_heads, dropout=0.1,
                 attention_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6,
                 ffn_activation="relu", **kwargs):
        super().__init__(num_layers, hidden_dim, intermediate_dim, num_heads, dropout,
                         attention_dropout, norm_first, layer_norm_epsilon, ffn_activation,
                         **kwargs)
        self.encoder_layers = self.make_layers(TransformerEncoderLayer)
        self.final_norm = self.make_final_norm()

    @property
    def stack_layers(self):
        return self.encoder_layers

    def call(self, x, padding_mask=None, training=None):
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=padding_mask, training=training)
        return self.finish(x)

    def call_with_weights(self, x, padding_mask=None, training=None):
        """Returns ``(output, [weights of layer i (batch, heads, src_len, src_len)])``."""
        all_weights = []
        for layer in self.encoder_layers:
            x, weights = layer.call_with_weights(x, padding_mask=padding_mask, training=training)
            all_weights.append(weights)
        return self.finish(x), all_weights
