"""Position-wise feed-forward network (§3.3): ``FFN(x) = max(0, x W1 + b1) W2 + b2``."""

from __future__ import annotations

import keras


@keras.saving.register_keras_serializable(package="aiayn")
class FeedForward(keras.layers.Layer):
    """Two dense layers with a ReLU between them, applied to each position alike.

    Args:
      hidden_dim: d_model (input and output width).
      intermediate_dim: d_ff (inner width; 2048 in the base model).
      activation: inner activation (the paper: ``"relu"``).

    Call args:
      x: ``(batch_size, seq_len, hidden_dim)``.

    Returns:
      ``(batch_size, seq_len, hidden_dim)``.
    """

    def __init__(self, hidden_dim, intermediate_dim, activation="relu", **kwargs):
        super().__init__(**kwargs)
        if hidden_dim < 1 or intermediate_dim < 1:
            raise ValueError(
                "`hidden_dim` and `intermediate_dim` must be positive. Received: "
                f"hidden_dim={hidden_dim}, intermediate_dim={intermediate_dim}."
            )
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.intermediate_dense = keras.layers.Dense(
            intermediate_dim, activation=activation, dtype=self.dtype_policy, name="intermediate")
        self.output_dense = keras.layers.Dense(hidden_dim, dtype=self.dtype_policy, name="output")

    def build(self, input_shape=None):
        self.intermediate_dense.build((None, None, self.hidden_dim))
        self.output_dense.build((None, None, self.intermediate_dim))
        self.built = True

    def call(self, x):
        return self.output_dense(self.intermediate_dense(x))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(hidden_dim=self.hidden_dim, intermediate_dim=self.intermediate_dim,
                      activation=self.activation)
        return config
