"""What the encoder and the decoder share (§3.1): a layer's hyperparameters, the stack of N
layers, and the residual connection around each sub-layer.

A layer (:class:`TransformerLayerBase`) and the stack of ``num_layers`` of them
(:class:`TransformerStackBase`) take the same hyperparameters, :data:`LAYER_ARGS`: they are kept
as attributes of those names and make up the Keras config. The stack builds its layers (named
``layer_<i>``) and, with pre-norm, the final LayerNorm that closes it (pre-norm outputs are
un-normalised). Subclasses create their layers and then the final norm, in that order (the
order of the variables, which checkpoints and the optimizer's slots follow).
"""

from __future__ import annotations

import keras

from aiayn.models.layer_norm import LayerNorm

# The arguments of a layer, in the order of its signature; a stack takes num_layers first.
LAYER_ARGS = ("hidden_dim", "intermediate_dim", "num_heads", "dropout", "attention_dropout",
              "norm_first", "layer_norm_epsilon", "ffn_activation")


def layer_norm(name, epsilon, dtype):
    """The model's LayerNorm (:class:`aiayn.models.layer_norm.LayerNorm`)."""
    return LayerNorm(epsilon=epsilon, dtype=dtype, name=name)


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


class TransformerLayerBase(keras.layers.Layer):
    """Keeps a layer's hyperparameters (:data:`LAYER_ARGS`) as attributes and config.

    Args:
      hidden_dim: d_model.
      intermediate_dim: d_ff.
      num_heads: h.
      dropout: P_drop on each sub-layer output (§5.4).
      attention_dropout: dropout on the attention weights.
      norm_first: pre-norm instead of the paper's post-norm.
      layer_norm_epsilon: LayerNorm epsilon.
      ffn_activation: the feed-forward network's activation (:class:`FeedForward`).
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

    def layer_args(self) -> dict:
        """The hyperparameters of one layer, by name."""
        return {name: getattr(self, name) for name in LAYER_ARGS}

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(self.layer_args())
        return config


class TransformerStackBase(TransformerLayerBase):
    """``num_layers`` layers of one kind, then (pre-norm only) the final LayerNorm.

    Arguments as :class:`TransformerLayerBase`, with ``num_layers`` first. A subclass creates
    its layers with :meth:`make_layers` and then ``self.final_norm = self.make_final_norm()``,
    and names the list in :attr:`stack_layers`.
    """

    def __init__(self, num_layers, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if num_layers < 1:
            raise ValueError(f"`num_layers` must be at least 1. Received: {num_layers}.")
        self.num_layers = num_layers

    def make_layers(self, layer_class) -> list:
        return [layer_class(**self.layer_args(), dtype=self.dtype_policy, name=f"layer_{i}")
                for i in range(self.num_layers)]

    def make_final_norm(self):
        if not self.norm_first:
            return None
        return layer_norm("final_norm", self.layer_norm_epsilon, self.dtype_policy)

    @property
    def stack_layers(self) -> list:
        """The stack's layers, in order (the subclass's attribute)."""
        raise NotImplementedError

    def build(self, input_shape=None):
        for layer in self.stack_layers:
            layer.build((None, None, self.hidden_dim))
        if self.final_norm is not None:
            self.final_norm.build((None, None, self.hidden_dim))
        self.built = True

    def finish(self, x):
        """The stack's output from its last layer's: the final norm of pre-norm."""
        return self.final_norm(x) if self.final_norm is not None else x

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers)
        return config
