"""Layer normalization (Ba et al., 2016) with its training gradient written out by hand."""

from __future__ import annotations

import keras
from keras import ops


def _normalize_with_gradient(x, gamma, beta, epsilon):
    """``gamma * (x - mean) / sqrt(var + epsilon) + beta`` over the last axis, in float32.

    The gradient is the closed form: with ``xhat`` the normalized input, ``g = dy * gamma`` and
    ``r = 1 / sqrt(var + epsilon)``, ``dx = r * (g - mean(g) - xhat * mean(g * xhat))``,
    ``dgamma = sum(dy * xhat)`` and ``dbeta = sum(dy)`` over every axis but the last. Autodiff
    of the moments reaches the same values through about twice the passes over the
    ``(B, T, d)`` activations (the variance's and the mean's paths separately, each broadcast
    back). On CPUs with bf16 units, where a step is mostly such elementwise work, layer norm
    was 16% of a ``small`` step's op time; with this gradient 5% (``bench/train_step_profile.py``;
    the step 1.03x to 1.0x faster in interleaved rounds on a noisy host, docs/RECIPE.md).

    ``x`` any float dtype ``(..., d)``; ``gamma``, ``beta`` float32 ``(d,)``. Returns float32
    ``(..., d)``; the gradient of ``x`` has ``x``'s dtype.
    """
    in_dtype = x.dtype

    @ops.custom_gradient
    def normalize(x, gamma, beta):
        # The forward pass is Keras's own ops (ops.layer_normalization's): eagerly the same
        # values that evaluation and the export compute.
        x32 = ops.cast(x, "float32")
        mean = ops.mean(x32, axis=-1, keepdims=True)
        centered = x32 - mean
        inv_std = ops.rsqrt(ops.mean(ops.square(centered), axis=-1, keepdims=True) + epsilon)
        inv = inv_std * gamma
        outputs = x32 * inv + (beta - mean * inv)

        def grad(*args, upstream=None):
            if upstream is None:  # TensorFlow passes the upstream gradient positionally
                (upstream,) = args
            upstream = ops.cast(upstream, "float32")
            normalized = centered * inv_std
            reduce_axes = tuple(range(len(upstream.shape) - 1))
            scaled = upstream * gamma
            dx = inv_std * (scaled - ops.mean(scaled, axis=-1, keepdims=True)
                            - normalized * ops.mean(scaled * normalized, axis=-1,
                                                    keepdims=True))
            return (ops.cast(dx, in_dtype), ops.sum(upstream * normalized, axis=reduce_axes),
                    ops.sum(upstream, axis=reduce_axes))

        return outputs, grad

    return normalize(x, gamma, beta)


@keras.saving.register_keras_serializable(package="aiayn")
class LayerNorm(keras.layers.LayerNormalization):
    """Keras's ``LayerNormalization`` over the last axis, with a hand-written training gradient.

    The same weights (``gamma``, ``beta``), config and inference graph as Keras's layer (so
    checkpoints, the SavedModel and the CTranslate2 export read it as before). In training the
    forward pass is still Keras's computation, op for op, and the backward pass the closed form
    of :func:`_normalize_with_gradient`. Statistics are float32 under every mixed policy.

    Args:
      epsilon: added to the variance.
      **kwargs: ``keras.layers.LayerNormalization``'s (``axis`` must be -1).

    Call args:
      inputs: ``(..., d)``.
      training: True takes the hand-written gradient; otherwise Keras's own computation.

    Returns:
      ``inputs``' shape, in the layer's compute dtype.
    """

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(epsilon=epsilon, **kwargs)
        if self.axis not in (-1, [-1]):
            raise ValueError(f"`LayerNorm` normalizes the last axis only. Received: "
                             f"axis={self.axis}.")

    def call(self, inputs, training=None):
        if not training or self.rms_scaling or not (self.center and self.scale):
            return super().call(inputs)
        # Read as tensors here: a variable read inside the custom-gradient function would need
        # TensorFlow's `variables` protocol; the read's own gradient reaches the variable.
        outputs = _normalize_with_gradient(inputs, ops.cast(self.gamma, "float32"),
                                           ops.cast(self.beta, "float32"), self.epsilon)
        return ops.cast(outputs, self.compute_dtype)
