"""The paper's learning-rate schedule (§5.3, eq. 3)."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="aiayn")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """``lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)``.

    Linear warm-up for ``warmup_steps`` steps, then decay with the inverse square root of the
    step. Steps count from 1: the optimizer's iteration 0 is step 1 (so the first rate is not 0).

    Args:
      hidden_dim: d_model.
      warmup_steps: the paper uses 4000.
      scale: multiplies the whole schedule (1.0 in the paper).

    Raises:
      ValueError: non-positive ``hidden_dim`` or ``warmup_steps``.

    Example:
      >>> optimizer = keras.optimizers.Adam(TransformerSchedule(512, 4000), beta_2=0.98,
      ...                                   epsilon=1e-9)
    """

    def __init__(self, hidden_dim, warmup_steps=4000, scale=1.0):
        if hidden_dim < 1 or warmup_steps < 1:
            raise ValueError(
                "`hidden_dim` and `warmup_steps` must be positive. Received: "
                f"hidden_dim={hidden_dim}, warmup_steps={warmup_steps}.")
        self.hidden_dim = hidden_dim
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        rate = ops.minimum(ops.rsqrt(step), step * float(self.warmup_steps) ** -1.5)
        return self.scale * float(self.hidden_dim) ** -0.5 * rate

    def get_config(self):
        return {"hidden_dim": self.hidden_dim, "warmup_steps": self.warmup_steps,
                "scale": self.scale}
