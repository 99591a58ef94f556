"""Decoder stack (§3.1): masked self-attention, encoder-decoder attention, feed-forward.

Cached incremental decoding follows the cache contract of :mod:`aiayn.models.attention`: the
decoder's self-attention cache is a tuple over layers of ``(key_cache, value_cache)``, each
``(B, H, K * L, D)`` (K = 1 but for beam search); its cross-attention cache a tuple over
layers of ``(key, value)``, each ``(B, H, S, D)``.
"""

from __future__ import annotations

import keras
from keras import ops

from aiayn.models.attention import MultiHeadAttention
from aiayn.models.dropout import Dropout
from aiayn.models.feedforward import FeedForward
from aiayn.models.masks import causal_mask, padding_to_attention_mask, self_attention_mask
from aiayn.models.stack import (
    TransformerLayerBase,
    TransformerStackBase,
    layer_norm,
    residual_sublayer,
)


@keras.saving.register_keras_serializable(package="aiayn")
class TransformerDecoderLayer(TransformerLayerBase):
    """Masked self-attention, encoder-decoder attention and feed-forward sub-layers (§3.1).

    Position i attends only to positions <= i (§3.2.3). Arguments as
    :class:`aiayn.models.encoder.TransformerEncoderLayer`.

    Call args:
      x: ``(batch_size, tgt_len, hidden_dim)``.
      encoder_outputs: ``(batch_size, src_len, hidden_dim)``.
      decoder_padding_mask: bool ``(batch_size, tgt_len)`` or None.
      encoder_padding_mask: bool ``(batch_size, src_len)`` or None.
      training: enables dropout.

    Returns:
      ``(batch_size, tgt_len, hidden_dim)``.
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
        self.cross_attention = MultiHeadAttention(hidden_dim, num_heads, attention_dropout,
                                                  self_attention=False, dtype=dt,
                                                  name="cross_attention")
        self.cross_attention_dropout = Dropout(dropout, dtype=dt, name="cross_attention_dropout")
        self.cross_attention_norm = layer_norm("cross_attention_norm", layer_norm_epsilon, dt)
        self.feed_forward = FeedForward(hidden_dim, intermediate_dim, ffn_activation,
                                        dtype=dt, name="feed_forward")
        self.feed_forward_dropout = Dropout(dropout, dtype=dt, name="feed_forward_dropout")
        self.feed_forward_norm = layer_norm("feed_forward_norm", layer_norm_epsilon, dt)

    def build(self, input_shape=None):
        shape = (None, None, self.hidden_dim)
        for layer in (self.self_attention, self.self_attention_norm, self.cross_attention,
                      self.cross_attention_norm, self.feed_forward, self.feed_forward_norm):
            layer.build(shape)
        self.built = True

    def _sublayers(self, x, self_attend, cross_attend, training):
        """§3.1 in order; each ``*_attend`` maps ``h -> (y, extra)``."""
        # Masked multi-head self-attention, dropout, residual, norm.
        x, self_extra = residual_sublayer(x, self_attend, self.self_attention_dropout,
                                          self.self_attention_norm, self.norm_first, training)
        # Multi-head attention over the encoder output, dropout, residual, norm.
        x, cross_extra = residual_sublayer(x, cross_attend, self.cross_attention_dropout,
                                           self.cross_attention_norm, self.norm_first, training)
        # Position-wise feed-forward, dropout, residual, norm.
        x, _ = residual_sublayer(x, lambda h: (self.feed_forward(h), None),
                                 self.feed_forward_dropout, self.feed_forward_norm,
                                 self.norm_first, training)
        return x, self_extra, cross_extra

    def call_with_weights(self, x, encoder_outputs, decoder_padding_mask=None,
                          encoder_padding_mask=None, training=None):
        """Returns ``(output, self_weights, cross_weights)``, weights float32
        ``(batch, heads, tgt_len, tgt_len)`` and ``(batch, heads, tgt_len, src_len)``."""
        self_mask = self_attention_mask(decoder_padding_mask, causal=True,
                                        length=ops.shape(x)[1])
        cross_mask = (None if encoder_padding_mask is None
                      else padding_to_attention_mask(encoder_padding_mask))
        return self._sublayers(
            x,
            lambda h: self.self_attention.call_with_weights(
                h, attention_mask=self_mask, training=training),
            lambda h: self.cross_attention.call_with_weights(
                h, encoder_outputs, attention_mask=cross_mask, training=training),
            training)

    def call(self, x, encoder_outputs, decoder_padding_mask=None, encoder_padding_mask=None,
             training=None):
        return self.call_with_weights(x, encoder_outputs, decoder_padding_mask,
                                      encoder_padding_mask, training)[0]

    def call_cached(self, x, self_cache, cross_cache, cache_index, self_mask, cross_mask,
                    beam_size=1):
        """One incremental step (inference: no dropout).

        Args:
          x: ``(B, T, hidden_dim)``, the new positions starting at ``cache_index``.
          self_cache: ``(key_cache, value_cache)`` each ``(B, H, L, D)``.
          cross_cache: ``(key, value)`` each ``(B, H, S, D)``.
          cache_index: scalar int.
          self_mask: bool broadcastable to ``(B, T, L)``; cross_mask: to ``(B, T, S)``.
          beam_size: K > 1: the beam layout of :mod:`aiayn.models.attention` (T = K).

        Returns:
          ``(output (B, T, hidden_dim), updated self_cache)``.
        """
        x, self_cache, _ = self._sublayers(
            x,
            lambda h: self.self_attention.call_cached(h, self_cache, cache_index, self_mask,
                                                      beam_size),
            lambda h: self.cross_attention.call_cached(h, cross_cache, None, cross_mask),
            training=False)
        return x, self_cache

    def call_growing(self, x, self_cache, cross_cache, cross_mask, beam_size):
        """One incremental step over a growing self-attention cache (inference: no dropout).

        Args:
          x: ``(B * K, hidden_dim)``, one row per beam (beams of a sentence adjacent).
          self_cache: ``(key, value)`` each ``(B * K, H, t, D)`` (see
            :meth:`MultiHeadAttention.call_appending`).
          cross_cache: ``(key, value)`` each ``(B, H, S, D)``, one row per sentence: its K
            beams are K queries against it.
          cross_mask: bool ``(B, 1, S)`` or None.
          beam_size: K (Python int).

        Returns:
          ``(output (B * K, hidden_dim), self_cache with t + 1 positions)``.
        """
        x, self_cache, _ = self._sublayers(
            x, lambda h: self.self_attention.call_appending(h, self_cache),
            lambda h: (self.cross_attention.call_beams(h, cross_cache, cross_mask, beam_size),
                       None),
            training=False)
        return x, self_cache



@keras.saving.register_keras_serializable(package="aiayn")
class TransformerDecoder(TransformerStackBase):
    """A stack of ``num_layers`` :class:`TransformerDecoderLayer` (+ final LayerNorm if pre-norm).

    Call args:
      x: embedded target ``(batch_size, tgt_len, hidden_dim)``.
      encoder_outputs: ``(batch_size, src_len, hidden_dim)``.
      decoder_padding_mask, encoder_padding_mask: bool padding masks or None.

    Returns:
      ``(batch_size, tgt_len, hidden_dim)``.
    """

    def __init__(self, num_layers, hidden_dim, intermediate_dim, num_heads, dropout=0.1,
                 attention_dropout=0.0, norm_first=False, layer_norm_epsilon=1e-6,
                 ffn_activation="relu", **kwargs):
        super().__init__(num_layers, hidden_dim, intermediate_dim, num_heads, dropout,
                         attention_dropout, norm_first, layer_norm_epsilon, ffn_activation,
                         **kwargs)
        self.decoder_layers = self.make_layers(TransformerDecoderLayer)
        self.final_norm = self.make_final_norm()

    @property
    def stack_layers(self):
        return self.decoder_layers

    def call(self, x, encoder_outputs, decoder_padding_mask=None, encoder_padding_mask=None,
             training=None):
        for layer in self.decoder_layers:
            x = layer(x, encoder_outputs, decoder_padding_mask=decoder_padding_mask,
                      encoder_padding_mask=encoder_padding_mask, training=training)
        return self.finish(x)

    def call_with_weights(self, x, encoder_outputs, decoder_padding_mask=None,
                          encoder_padding_mask=None, training=None):
        """Returns ``(output, [self weights per layer], [cross weights per layer])``."""
        self_weights, cross_weights = [], []
        for layer in self.decoder_layers:
            x, sw, cw = layer.call_with_weights(x, encoder_outputs, decoder_padding_mask,
                                                encoder_padding_mask, training)
            self_weights.append(sw)
            cross_weights.append(cw)
        return self.finish(x), self_weights, cross_weights

    # -- cached decoding ----------------------------------------------------------------------
    def init_cache(self, batch_size, max_length, beam_size=1):
        """Zeroed self-attention cache: a tuple over layers of ``(key, value)``, each
        ``(B, H, K * L, D)`` (K = beam_size; the beam layout of ``aiayn.models.attention``)."""
        head_dim = self.hidden_dim // self.num_heads
        shape = (batch_size, self.num_heads, beam_size * max_length, head_dim)
        return tuple((ops.zeros(shape, self.compute_dtype), ops.zeros(shape, self.compute_dtype))
                     for _ in self.decoder_layers)

    def cross_cache(self, encoder_outputs):
        """Per-layer cross-attention ``(key, value)``, each ``(B, H, S, D)``, projected once."""
        return tuple(layer.cross_attention.project_key_value(encoder_outputs)
                     for layer in self.decoder_layers)

    def call_cached(self, x, self_cache, cross_cache, cache_index, encoder_padding_mask=None,
                    ancestry=None):
        """Decodes new positions starting at ``cache_index`` against the caches.

        Args:
          x: embedded new positions ``(B, T, hidden_dim)``; for beam search ``(B, K, hidden)``,
            one row per beam, all at position ``cache_index``.
          self_cache: from :meth:`init_cache` (or a previous step); cross_cache: from
            :meth:`cross_cache`; encoder_padding_mask: bool ``(B, S)`` or None.
          ancestry: beam search only: int32 ``(B, K, L)``, for each beam the slot row (beam
            index) holding each position of its hypothesis, already including
            ``cache_index``; K (static) is the beam size. None: plain decoding.

        Returns:
          ``(output (B, T, hidden_dim), updated self_cache)``.
        """
        cross_mask = (None if encoder_padding_mask is None
                      else padding_to_attention_mask(encoder_padding_mask))  # (B, 1, S)
        if ancestry is None:
            beam_size = 1
            max_length = ops.shape(self_cache[0][0])[2]
            # Query t (absolute position cache_index + t) sees slots <= cache_index + t.
            self_mask = causal_mask(ops.shape(x)[1], max_length, cache_index)[None]  # (1, T, L)
        else:
            beam_size = ancestry.shape[1]
            max_length = ops.shape(ancestry)[2]
            slots = ops.arange(beam_size, dtype="int32")[None, None, :, None]  # (1, 1, K, 1)
            written = ops.arange(max_length, dtype="int32") <= cache_index  # (L,)
            # Beam j may read slot (k, i) iff position i of its hypothesis was written by k.
            own = ops.logical_and(ops.equal(ancestry[:, :, None, :], slots),
                                  written)  # (B, K, K, L)
            self_mask = ops.reshape(own, (-1, beam_size, beam_size * max_length))  # (B,K,K*L)
        new_cache = []
        for layer, layer_self, layer_cross in zip(self.decoder_layers, self_cache, cross_cache):
            x, layer_self = layer.call_cached(x, layer_self, layer_cross, cache_index,
                                              self_mask, cross_mask, beam_size)
            new_cache.append(layer_self)
        return self.finish(x), tuple(new_cache)

    def empty_cache(self, rows, length):
        """A growing self-attention cache with no position yet: per layer ``(key, value)``,
        each ``(rows, H, length, D)``. ``length`` is 0, but pass it as a tensor whose value the
        graph cannot know (e.g. derived from the source length): a ``tf.while_loop`` accepts a
        dimension that changes across iterations only if its static size is unknown."""
        head_dim = self.hidden_dim // self.num_heads
        shape = (rows, self.num_heads, length, head_dim)
        return tuple((ops.zeros(shape, self.compute_dtype), ops.zeros(shape, self.compute_dtype))
                     for _ in self.decoder_layers)

    def call_growing(self, x, self_cache, cross_cache, encoder_padding_mask, beam_size):
        """:meth:`DecoderLayer.call_growing` through every layer; ``x`` ``(B * K, hidden)``,
        ``encoder_padding_mask`` bool ``(B, S)`` or None. Returns ``(output, self_cache)``."""
        cross_mask = (None if encoder_padding_mask is None
                      else padding_to_attention_mask(encoder_padding_mask))  # (B, 1, S)
        new_cache = []
        for layer, layer_self, layer_cross in zip(self.decoder_layers, self_cache, cross_cache):
            x, layer_self = layer.call_growing(x, layer_self, layer_cross, cross_mask, beam_size)
            new_cache.append(layer_self)
        return self.finish(x), tuple(new_cache)

