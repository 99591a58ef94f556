"""Input limits shared by every path that feeds the encoder (pure Python, no TensorFlow)."""

from __future__ import annotations


def source_limit(max_input_tokens: int, max_position: int, max_extra_length: int) -> int:
    """The most source tokens any path feeds the encoder: THE limit of
    :meth:`aiayn.models.tokenizer.SubwordTokenizer.featurize_source`.

    The configured ``max_input_tokens`` (``export.max_input_tokens``), capped so that decoding
    stays inside the position table: the decoder runs up to ``source + max_extra_length``
    positions plus BOS, which must fit in ``max_position``.

    Args:
      max_input_tokens: the configured limit (``export.max_input_tokens``).
      max_position: the model's position table size (``model.max_position``).
      max_extra_length: tokens generated beyond the source length (``decode.max_extra_length``).

    Returns:
      The limit, at least 1.

    Raises:
      ValueError: the three values leave no room for a single source token.
    """
    limit = min(int(max_input_tokens), int(max_position) - int(max_extra_length) - 1)
    if limit < 1:
        raise ValueError(
            f"`export.max_input_tokens`={max_input_tokens} leaves no room: the model has "
            f"max_position={max_position} and decoding adds max_extra_length="
            f"{max_extra_length}. Raise model.max_position or lower decode.max_extra_length.")
    return limit
