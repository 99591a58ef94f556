"""Attention masks: padding, causal, and the one helper that merges them.

Conventions used everywhere in ``aiayn.models``:

* A *padding mask* is boolean ``(batch_size, length)``, True where a real token stands.
* An *attention mask* is boolean and broadcastable to ``(batch_size, query_len, key_len)``,
  True where the query may attend to the key. Attention layers add the heads axis themselves.
* Masked scores are replaced (``where``, not added) with :func:`mask_value`, a large negative
  that fits the compute dtype, so float16 cannot overflow to ``-inf`` and fully masked rows
  give a uniform (finite) softmax instead of NaN.
"""

from __future__ import annotations

import keras
from keras import ops

# Finite "minus infinity" per dtype: large enough that exp() underflows to 0 after softmax,
# small enough in magnitude to be representable (float16 max is 65504).
_MASK_VALUES = {"float16": -3.0e4, "bfloat16": -1.0e9, "float32": -1.0e9, "float64": -1.0e9}


def mask_value(dtype) -> float:
    """A large negative number representable in ``dtype`` (used for masked attention scores).

    Raises:
      ValueError: ``dtype`` is not a floating dtype.
    """
    name = keras.backend.standardize_dtype(dtype)
    if name not in _MASK_VALUES:
        raise ValueError(
            f"`mask_value` needs a floating dtype (one of {', '.join(_MASK_VALUES)}). "
            f"Received: dtype={name}."
        )
    return _MASK_VALUES[name]


def causal_mask(query_length, key_length=None, query_offset=0):
    """Lower-triangular mask: query position ``i + query_offset`` sees key positions ``<= i``.

    Args:
      query_length: number of query positions (int or scalar tensor).
      key_length: number of key positions; defaults to ``query_length``.
      query_offset: absolute position of the first query (for cached decoding).

    Returns:
      bool ``(query_length, key_length)``.

    Example:
      >>> causal_mask(3)  # [[T, F, F], [T, T, F], [T, T, T]]
    """
    if key_length is None:
        key_length = query_length
    rows = ops.arange(query_length, dtype="int32")[:, None] + query_offset  # (q, 1)
    cols = ops.arange(key_length, dtype="int32")[None, :]  # (1, k)
    return ops.greater_equal(rows, cols)  # (q, k)


def padding_to_attention_mask(key_padding_mask):
    """``(batch, key_len)`` padding mask -> ``(batch, 1, key_len)`` attention mask."""
    return ops.expand_dims(ops.cast(key_padding_mask, "bool"), axis=1)


def merge_masks(*masks):
    """Logical AND of broadcastable boolean masks; ``None`` entries are skipped.

    Returns:
      The merged bool mask, or ``None`` when every entry is ``None``.
    """
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def self_attention_mask(padding_mask=None, causal=False, length=None):
    """The mask of a self-attention sub-layer: keys that are real tokens (and not in the future).

    Args:
      padding_mask: bool ``(batch, length)`` or None.
      causal: add the causal mask (decoder self-attention, §3.2.3).
      length: sequence length; needed when ``causal`` and ``padding_mask`` is None.

    Returns:
      bool broadcastable to ``(batch, length, length)``, or None (attend everywhere).
    """
    key_mask = None if padding_mask is None else padding_to_attention_mask(padding_mask)
    future = None
    if causal:
        if length is None:
            length = ops.shape(padding_mask)[1]
        future = causal_mask(length)[None, :, :]  # (1, length, length)
    return merge_masks(key_mask, future)


def update_at(buffer, index, values, axis=1):
    """Writes ``values`` into ``buffer`` at ``[..., index:index + T, ...]`` along ``axis``.

    The static-shape cache write of incremental decoding. It is a select against a position
    mask (``where``), not ``slice_update``: on the TensorFlow backend ``slice_update`` lowers to
    ``XlaDynamicUpdateSlice``, which the stock ``tensorflow_model_server`` runs only with its
    experimental XLA:CPU JIT enabled; ``where`` is a core op everywhere and keeps every shape
    static (XLA fuses it into an in-place update).

    Args:
      buffer: ``(..., L, ...)`` with ``L`` at ``axis``.
      index: scalar int (tensor or Python), the first position to write.
      values: like ``buffer`` but with ``T`` (static, >= 1) positions at ``axis``.
      axis: the position axis (non-negative).

    Returns:
      A tensor like ``buffer`` with positions ``index .. index + T - 1`` replaced.
    """
    length = ops.shape(buffer)[axis]
    span = values.shape[axis]
    positions = ops.arange(length, dtype="int32") - ops.cast(index, "int32")  # (L,)
    shape = [1] * len(buffer.shape)
    shape[axis] = -1
    values = ops.cast(values, buffer.dtype)
    if span == 1:
        selected = ops.reshape(ops.equal(positions, 0), shape)
        return ops.where(selected, values, buffer)  # values broadcast along `axis`
    inside = ops.logical_and(ops.greater_equal(positions, 0), ops.less(positions, span))
    source = ops.clip(positions, 0, span - 1)  # (L,) which new position lands at each slot
    spread = ops.take(values, source, axis=axis)  # like `buffer`
    return ops.where(ops.reshape(inside, shape), spread, buffer)
