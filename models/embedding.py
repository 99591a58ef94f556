"""Token embedding scaled by sqrt(d_model) (§3.4) plus sinusoidal positions (§3.5)."""

from __future__ import annotations

import math

import keras
from keras import ops

from aiayn.models.dropout import Dropout


def sinusoidal_table(length, dim, start=0, dtype="float32"):
    """The paper's positional encoding (§3.5), sine on even dimensions, cosine on odd ones.

    ``PE(pos, 2i) = sin(pos / 10000^(2i/dim))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/dim))``.

    Args:
      length: number of positions (int or scalar tensor).
      dim: model width ``d_model``; must be even.
      start: first position (int or scalar tensor), for cached decoding.
      dtype: output dtype.

    Returns:
      ``(length, dim)`` tensor.

    Raises:
      ValueError: ``dim`` is odd.

    Example:
      >>> keras.ops.convert_to_numpy(sinusoidal_table(50, 16))  # plot with imshow
    """
    if dim % 2:
        raise ValueError(
            f"The sinusoidal encoding needs an even `dim` (sine/cosine pairs). Received: dim={dim}."
        )
    positions = ops.cast(ops.arange(length, dtype="int32") + start, "float32")  # (length,)
    # 1 / 10000^(2i/dim) for i = 0 .. dim/2 - 1.
    inv_freq = ops.exp(ops.arange(0, dim, 2, dtype="float32") * (-math.log(10000.0) / dim))
    angles = positions[:, None] * inv_freq[None, :]  # (length, dim/2)
    # Interleave: (length, dim/2, 2) -> (length, dim) puts sin at 2i and cos at 2i+1.
    table = ops.reshape(ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1), (-1, dim))
    return ops.cast(table, dtype)


@keras.saving.register_keras_serializable(package="aiayn")
class TransformerEmbedding(keras.layers.Layer):
    """``dropout(token_dropout(sqrt(d_model) * E[token]) + PE[position])``.

    The token table is shared by encoder, decoder and (when tied) the output projection
    (§3.4); it is initialised with std ``hidden_dim ** -0.5`` so that the scaled embedding
    has unit variance, the same scale as the sinusoids.

    Args:
      vocabulary_size: number of token ids.
      hidden_dim: d_model.
      dropout: P_drop applied to the sum (§5.4).
      token_dropout: the probability that a token's whole embedding is zeroed in training, its
        position kept ("word dropout": Gal & Ghahramani, 2016; Sennrich & Zhang, 2019); kept
        tokens are scaled by ``1 / (1 - token_dropout)``. It has no weights; 0 (the paper) builds
        no layer, so a seeded model draws the same initial weights as before the option.

    Call args:
      token_ids: int ``(batch_size, seq_len)``.
      start_index: position of the first token (int or scalar tensor; cached decoding).
      training: enables dropout.

    Returns:
      ``(batch_size, seq_len, hidden_dim)`` in the compute dtype.
    """

    def __init__(self, vocabulary_size, hidden_dim, dropout=0.0, token_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        if hidden_dim % 2:
            raise ValueError(
                "`hidden_dim` must be even for the sinusoidal encoding. "
                f"Received: hidden_dim={hidden_dim}. Fix: use an even width (e.g. 512)."
            )
        if vocabulary_size < 1:
            raise ValueError(f"`vocabulary_size` must be positive. Received: {vocabulary_size}.")
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim
        self.dropout = dropout
        self.token_dropout = token_dropout
        self.token_embedding = keras.layers.Embedding(
            vocabulary_size,
            hidden_dim,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy, name="dropout")
        # One draw a token (the mask's last axis 1): Keras's mask, a (batch, seq_len, 1) tensor.
        self.token_dropout_layer = None
        if token_dropout:
            self.token_dropout_layer = Dropout(token_dropout, noise_shape=(None, None, 1),
                                               dtype=self.dtype_policy, name="token_dropout")
        self._scale = math.sqrt(hidden_dim)

    def build(self, input_shape=None):
        self.token_embedding.build(input_shape)
        self.built = True

    @property
    def embeddings(self):
        """The shared ``(vocabulary_size, hidden_dim)`` table (a variable)."""
        return self.token_embedding.embeddings

    def call(self, token_ids, start_index=0, training=None):
        x = self.token_embedding(token_ids) * ops.cast(self._scale, self.compute_dtype)
        if self.token_dropout_layer is not None:
            x = self.token_dropout_layer(x, training=training)
        length = ops.shape(token_ids)[1]
        positions = sinusoidal_table(length, self.hidden_dim, start_index, self.compute_dtype)
        x = x + positions[None, :, :]  # (batch, seq_len, hidden_dim)
        return self.dropout_layer(x, training=training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(vocabulary_size=self.vocabulary_size, hidden_dim=self.hidden_dim,
                      dropout=self.dropout, token_dropout=self.token_dropout)
        return config
