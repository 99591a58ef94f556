"""Multi-head scaled dot-product attention (§3.2) with a static-shape key/value cache.

Cache contract (written once; every cached call in ``aiayn.models`` follows it). Shape letters:

    B  batch size (sentences; with beam search see "Beam search" below)
    L  cache length = the longest decoded sequence (static inside the decoding loop)
    S  source length (encoder positions)
    T  number of new query positions in one call (1 when decoding token by token)
    H  num_heads
    D  head_dim = hidden_dim // num_heads

* Keys, values and queries are kept head-major, ``(B, H, positions, D)``: the layout the
  batched matmuls of attention read directly, so a decoding step never transposes a cache
  (a ``(B, L, H, D)`` cache cost one full transposed copy per tensor per layer per step).
* Self-attention cache of one layer: a tuple ``(key_cache, value_cache)``, each ``(B, H, L, D)``
  in the compute dtype, zeros at first. A cached call with ``cache_index = i`` writes the keys
  and values of its ``T`` new positions at ``[:, :, i:i+T]`` with
  :func:`aiayn.models.masks.update_at` (a select against a position mask: shapes never change,
  never a concatenation, stock TensorFlow ops only, fused in place under XLA) and
  attends over all ``L`` slots; the caller's ``attention_mask`` (``(B, T, L)``, broadcastable)
  hides the slots that are not yet written (``position > i + t``).
* Beam search (``beam_size = K > 1``): the self-attention cache of a sentence holds one slot
  row per beam, ``(B, H, K * L, D)`` with B counting *sentences* (slot ``j * L + i``: position
  ``i`` written by beam ``j``). The K beams of a sentence are the K query positions of one
  call (``T = K``, all at position ``cache_index``); beam ``j`` writes slot ``(j, i)``. When the
  search re-ranks beams, nothing here is copied: the caller keeps, per beam, which slot row
  holds each position of its hypothesis (its ancestry) and passes it as the attention mask
  (``(B, K, K * L)``), so each beam reads exactly its own history. With ``K = 1`` this is the
  layout above.
* Growing cache (:meth:`MultiHeadAttention.call_appending`; eager or ``tf.function`` without
  XLA, where a loop may change shapes): one row per beam, ``(N, H, t, D)`` holding exactly the
  ``t`` positions of that row's hypothesis; each step appends one position (a concatenation)
  and attends over all of them, no mask. Re-ranking beams gathers rows (and may drop the rows
  of finished sentences), so a step costs what the hypotheses so far cost, not ``K * L``.
* Cross-attention cache of one layer: ``(key, value)``, each ``(B, H, S, D)``, projected once
  from the encoder outputs by :meth:`MultiHeadAttention.project_key_value`; never updated.
* The decoder keeps one such tuple per layer, in a tuple over layers (see ``decoder.py``).
"""

from __future__ import annotations

import math

import keras
from keras import ops

from aiayn.models.dropout import Dropout
from aiayn.models.masks import mask_value, update_at


def _split_heads(x, num_heads, head_dim):
    """``(B, T, H * D)`` -> head-major ``(B, H, T, D)``."""
    x = ops.reshape(x, (ops.shape(x)[0], ops.shape(x)[1], num_heads, head_dim))
    return ops.transpose(x, (0, 2, 1, 3))


@keras.saving.register_keras_serializable(package="aiayn")
class MultiHeadAttention(keras.layers.Layer):
    """``MultiHead(Q, K, V) = Concat(head_1..head_h) W^O`` (§3.2.2), written with keras.ops.

    Self-attention uses one fused ``(hidden_dim, 3 * hidden_dim)`` projection for Q, K and V;
    cross-attention one for Q and one fused ``(hidden_dim, 2 * hidden_dim)`` for K and V.
    Scores are scaled by ``1/sqrt(d_k)`` (§3.2.1, applied to Q before the product, which keeps
    float16 scores small), masked with a dtype-aware large negative, and softmaxed in float32.

    Args:
      hidden_dim: d_model (input and output width).
      num_heads: h; must divide ``hidden_dim`` (d_k = d_v = hidden_dim / h).
      dropout: dropout rate on the attention weights.
      self_attention: True for self-attention (fused QKV); False for encoder-decoder attention.
      use_bias: add biases to the projections.

    Call args:
      query: ``(batch_size, query_len, hidden_dim)``.
      value: ``(batch_size, key_len, hidden_dim)``; must be None for self-attention.
      attention_mask: bool broadcastable to ``(batch_size, query_len, key_len)``, True where
        attention is allowed; None attends everywhere.
      training: enables attention dropout.

    Returns:
      ``(batch_size, query_len, hidden_dim)``. :meth:`call_with_weights` also returns the
      float32 weights ``(batch_size, num_heads, query_len, key_len)``; :meth:`call_cached`
      returns ``(output, cache)`` (see the module docstring).

    Raises:
      ValueError: ``num_heads`` does not divide ``hidden_dim``.

    Example:
      >>> mha = MultiHeadAttention(hidden_dim=16, num_heads=2)
      >>> y = mha(keras.random.normal((2, 5, 16)), attention_mask=mask)  # (2, 5, 16)
    """

    def __init__(self, hidden_dim, num_heads, dropout=0.0, self_attention=True, use_bias=True,
                 **kwargs):
        super().__init__(**kwargs)
        if num_heads < 1 or hidden_dim % num_heads:
            raise ValueError(
                "`num_heads` must divide `hidden_dim`. Received: "
                f"hidden_dim={hidden_dim}, num_heads={num_heads}. Fix: choose num_heads among "
                f"the divisors of {hidden_dim} (the paper: 512 / 8 = 64 per head)."
            )
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.self_attention = self_attention
        self.use_bias = use_bias
        self.head_dim = hidden_dim // num_heads
        dense = dict(use_bias=use_bias, kernel_initializer="glorot_uniform",
                     dtype=self.dtype_policy)
        if self_attention:
            self.qkv_dense = keras.layers.Dense(3 * hidden_dim, name="qkv", **dense)
        else:
            self.query_dense = keras.layers.Dense(hidden_dim, name="query", **dense)
            self.key_value_dense = keras.layers.Dense(2 * hidden_dim, name="key_value", **dense)
        self.output_dense = keras.layers.Dense(hidden_dim, name="output", **dense)
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy, name="attention_dropout")

    def build(self, query_shape=None, value_shape=None):
        width = (None, None, self.hidden_dim)
        if self.self_attention:
            self.qkv_dense.build(width)
        else:
            self.query_dense.build(width)
            self.key_value_dense.build(width)
        self.output_dense.build(width)
        self.built = True

    # -- projections -------------------------------------------------------------------------
    def _project_qkv(self, query):
        """``(B, T, hidden)`` -> q, k, v each ``(B, H, T, D)`` from one fused matmul."""
        qkv = self.qkv_dense(query)  # (B, T, 3 * hidden)
        q, k, v = ops.split(qkv, 3, axis=-1)  # 3 x (B, T, hidden)
        return tuple(_split_heads(t, self.num_heads, self.head_dim) for t in (q, k, v))

    def project_key_value(self, value):
        """Encoder outputs ``(B, S, hidden)`` -> ``(key, value)`` each ``(B, H, S, D)``.

        Used once per sentence to build the cross-attention cache.
        """
        if self.self_attention:
            raise ValueError("`project_key_value` is for cross-attention layers "
                             "(self_attention=False).")
        kv = self.key_value_dense(value)  # (B, S, 2 * hidden)
        k, v = ops.split(kv, 2, axis=-1)  # 2 x (B, S, hidden)
        return (_split_heads(k, self.num_heads, self.head_dim),
                _split_heads(v, self.num_heads, self.head_dim))

    def _project_query(self, query):
        return _split_heads(self.query_dense(query), self.num_heads, self.head_dim)

    # -- scaled dot-product attention (§3.2.1) -------------------------------------------------
    def _attend(self, q, k, v, attention_mask, training):
        """q ``(B, H, T, D)``, k and v ``(B, H, S, D)`` -> ``(B, T, hidden)``, weights f32."""
        out, weights = self._weighted_values(q, k, v, attention_mask, training)  # (B, H, T, D)
        out = ops.transpose(out, (0, 2, 1, 3))  # (B, T, H, D)
        out = ops.reshape(out, (ops.shape(out)[0], ops.shape(out)[1], self.hidden_dim))
        return self.output_dense(out), weights  # (B, T, hidden)

    def _weighted_values(self, q, k, v, attention_mask, training):
        """``softmax(q k^T / sqrt(D)) v`` per head: ``(B, H, T, D)``, weights f32."""
        q = q * ops.cast(1.0 / math.sqrt(self.head_dim), q.dtype)
        # Batched matmuls over (B, H); the key transpose folds into the matmul (adjoint).
        scores = ops.matmul(q, ops.swapaxes(k, -1, -2))  # (B, H, T, S)
        scores = ops.cast(scores, "float32")  # softmax in float32 (numerical stability)
        if attention_mask is not None:
            mask = ops.cast(attention_mask, "bool")
            if len(mask.shape) == 3:
                mask = mask[:, None, :, :]  # (B, 1, T, S): same mask for every head
            scores = ops.where(mask, scores, mask_value(scores.dtype))
        weights = ops.softmax(scores, axis=-1)  # (B, H, T, S) float32
        probs = self.dropout_layer(ops.cast(weights, self.compute_dtype), training=training)
        return ops.matmul(probs, v), weights  # (B, H, T, D)

    def _qkv(self, query, value):
        if self.self_attention:
            if value is not None:
                raise ValueError("A self-attention layer takes `query` only; received `value`. "
                                 "Fix: build it with self_attention=False for cross-attention.")
            return self._project_qkv(query)
        if value is None:
            raise ValueError("A cross-attention layer needs `value` (the encoder outputs).")
        return (self._project_query(query),) + self.project_key_value(value)

    def call(self, query, value=None, attention_mask=None, training=None):
        q, k, v = self._qkv(query, value)
        return self._attend(q, k, v, attention_mask, training)[0]

    def call_with_weights(self, query, value=None, attention_mask=None, training=None):
        """Like ``call`` but returns ``(output, weights)``; weights float32 ``(B, H, T, S)``."""
        q, k, v = self._qkv(query, value)
        return self._attend(q, k, v, attention_mask, training)

    def call_cached(self, query, cache, cache_index=None, attention_mask=None, beam_size=1):
        """Incremental attention over a cache (contract in the module docstring).

        Args:
          query: ``(B, T, hidden)`` new positions (T = 1 when decoding token by token).
          cache: self-attention: ``(key_cache, value_cache)`` each ``(B, H, L, D)``;
            cross-attention: ``(key, value)`` each ``(B, H, S, D)``.
          cache_index: scalar int, position of the first new query (self-attention only).
          attention_mask: bool broadcastable to ``(B, T, L)`` (or ``(B, T, S)``).
          beam_size: K > 1 for the beam layout of the module docstring: ``query`` is
            ``(B, K, hidden)`` (one row per beam, all at ``cache_index``), the self-attention
            cache ``(B, H, K * L, D)``, and beam ``j`` writes slot ``j * L + cache_index``.

        Returns:
          ``(output (B, T, hidden), cache)``; the self-attention cache with the new keys and
          values written at ``[:, :, cache_index:cache_index + T]``, the cross cache unchanged.
        """
        if self.self_attention:
            q, k_new, v_new = self._project_qkv(query)  # each (B, H, T, D)
            cache = tuple(self._write(c, cache_index, new, beam_size)
                          for c, new in zip(cache, (k_new, v_new)))
        else:
            q = self._project_query(query)
        output, _ = self._attend(q, cache[0], cache[1], attention_mask, training=False)
        return output, cache

    # -- one query per row, 2-D (the growing-cache decoding step) ------------------------------
    def call_appending(self, query, cache):
        """Self-attention of one new position per row over a growing cache (no mask).

        Args:
          query: ``(N, hidden)``, one new position per row (2-D: every projection is then one
            plain matmul).
          cache: ``(key_cache, value_cache)`` each ``(N, H, t, D)``: exactly the positions
            this row attends to (its own hypothesis); ``t`` may be 0.

        Returns:
          ``(output (N, hidden), cache)`` with the new key and value appended:
          ``(N, H, t + 1, D)``.
        """
        qkv = ops.split(self.qkv_dense(query), 3, axis=-1)  # 3 x (N, hidden)
        q, k_new, v_new = (ops.reshape(t, (-1, self.num_heads, 1, self.head_dim)) for t in qkv)
        cache = tuple(ops.concatenate([c, ops.cast(new, c.dtype)], axis=2)
                      for c, new in zip(cache, (k_new, v_new)))
        out, _ = self._weighted_values(q, cache[0], cache[1], None, training=False)
        return self.output_dense(ops.reshape(out, (-1, self.hidden_dim))), cache

    def call_beams(self, query, cache, attention_mask, beam_size):
        """Cross-attention of ``K`` beams per sentence against its one memory row.

        Args:
          query: ``(B * K, hidden)``, the K beams of a sentence adjacent.
          cache: ``(key, value)`` each ``(B, H, S, D)`` (:meth:`project_key_value`).
          attention_mask: bool ``(B, 1, S)`` or None.
          beam_size: K (Python int).

        Returns:
          ``(B * K, hidden)``.
        """
        q = ops.reshape(self.query_dense(query), (-1, beam_size, self.num_heads, self.head_dim))
        q = ops.transpose(q, (0, 2, 1, 3))  # (B, H, K, D)
        out, _ = self._weighted_values(q, cache[0], cache[1], attention_mask, training=False)
        out = ops.transpose(out, (0, 2, 1, 3))  # (B, K, H, D)
        return self.output_dense(ops.reshape(out, (-1, self.hidden_dim)))

    @staticmethod
    def _write(cache, index, new, beam_size):
        """Writes new keys or values ``(B, H, T, D)`` into a ``(B, H, K * L, D)`` cache."""
        if beam_size == 1:
            return update_at(cache, index, new, axis=2)  # positions index .. index + T - 1
        shape = ops.shape(cache)
        slots = ops.reshape(cache, (shape[0], shape[1], beam_size, -1, shape[3]))  # (B,H,K,L,D)
        slots = update_at(slots, index, new[:, :, :, None, :], axis=3)  # beam j -> slot (j, i)
        return ops.reshape(slots, shape)

    def compute_output_shape(self, query_shape, value_shape=None):
        return query_shape

    def get_config(self):
        config = super().get_config()
        config.update(hidden_dim=self.hidden_dim, num_heads=self.num_heads, dropout=self.dropout,
                      self_attention=self.self_attention, use_bias=self.use_bias)
        return config
