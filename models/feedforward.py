"""Position-wise feed-forward network (§3.3): ``FFN(x) = max(0, x W1 + b1) W2 + b2``.

Gated variants (Shazeer, 2020, "GLU Variants Improve Transformer"): ``swiglu`` computes
``(silu(x W) * (x V)) W2`` and ``geglu`` the same with GELU. ``W`` and ``V`` are one dense layer
of width ``2 * d_ff`` (one matmul), split in two: the gate ``W`` first, the linear half ``V``
second. With ``d_ff`` at two thirds of the ReLU width, the parameters and FLOPs are those of the
ungated network.
"""

from __future__ import annotations

import keras
from keras import ops

# The ungated activations (a Keras activation name) and the gated ones (the gate's activation).
ACTIVATIONS = ("relu", "gelu")
GATED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu"}


def check_activation(activation: str) -> None:
    """Raises ValueError unless ``activation`` is one :class:`FeedForward` takes."""
    if activation not in ACTIVATIONS and activation not in GATED_ACTIVATIONS:
        choices = ", ".join((*ACTIVATIONS, *GATED_ACTIVATIONS))
        raise ValueError(f"`ffn_activation` must be one of {choices}. Received: {activation!r}.")


@keras.saving.register_keras_serializable(package="aiayn")
class FeedForward(keras.layers.Layer):
    """Two dense layers with an activation between them, applied to each position alike.

    Args:
      hidden_dim: d_model (input and output width).
      intermediate_dim: d_ff (inner width; 2048 in the base model).
      activation: inner activation: ``"relu"`` (the paper), ``"gelu"``, or a gated one,
        ``"swiglu"`` or ``"geglu"`` (the inner dense layer is then ``2 * d_ff`` wide).

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
        check_activation(activation)
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.gate_activation = GATED_ACTIVATIONS.get(activation)
        gated = self.gate_activation is not None
        self.intermediate_dense = keras.layers.Dense(
            2 * intermediate_dim if gated else intermediate_dim,
            activation=None if gated else activation, dtype=self.dtype_policy,
            name="intermediate")
        self.output_dense = keras.layers.Dense(hidden_dim, dtype=self.dtype_policy, name="output")

    def build(self, input_shape=None):
        self.intermediate_dense.build((None, None, self.hidden_dim))
        self.output_dense.build((None, None, self.intermediate_dim))
        self.built = True

    def call(self, x):
        h = self.intermediate_dense(x)
        if self.gate_activation is not None:
            gate, linear = ops.split(h, 2, axis=-1)
            h = keras.activations.get(self.gate_activation)(gate) * linear
        return self.output_dense(h)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(hidden_dim=self.hidden_dim, intermediate_dim=self.intermediate_dim,
                      activation=self.activation)
        return config
