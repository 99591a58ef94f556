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


@keras.saving.register_keras_serializable(package="aiayn")
class BudgetSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to the paper's peak rate, then a linear decay to zero at the budget's end.

    Between the two, the rate holds at the peak (``hold="constant"``, a trapezoid) or follows the
    paper's inverse square root (``hold="rsqrt"``: §5.3's schedule with a cool-down at the end).

    For a run that ends at a budget (a step count, a time limit, or both), the rate reaches
    zero exactly when the run stops, instead of the inverse square root's ``sqrt(warmup/step)``
    of the peak (about half of it at 4 x the warm-up). ``progress`` is the share of the budget
    spent: ``step / total_steps``, or, where a time limit ends the run first, the share of the
    time limit, which a callback writes into :attr:`time_progress` (see
    :class:`aiayn.pipeline.training.callbacks.BudgetProgress`)::

        peak   = scale * d_model^-0.5 * warmup_steps^-0.5     (the §5.3 schedule's maximum)
        warmup = max(step / warmup_steps, progress / warmup_fraction)
        left   = min(1, (1 - progress) / decay_fraction)   (1 until the decay, then down to 0)
        decay  = left                        (decay_shape="linear")
        decay  = 1 - sqrt(1 - left)          (decay_shape="sqrt": Hägele et al., 2024, "1-sqrt")
        lr     = peak * min(warmup, decay)                                  (hold="constant")
        lr     = peak * min(warmup, sqrt(warmup_steps / step)) * decay     (hold="rsqrt")

    The warm-up ends after ``warmup_steps`` steps or ``warmup_fraction`` of the budget,
    whichever comes first (0: steps only), so that on a slow machine, where a time budget buys
    few steps, the warm-up does not eat the run. ``decay_fraction`` is the final share of the
    budget over which the rate falls to zero (1.0: from the start, so the warm-up ramp meets a
    falling line). ``decay_shape`` is the decay's curve: a straight line, or ``1 - sqrt`` of
    the decay's elapsed share, which halves the rate in the decay's first quarter and spends
    longer at low rates.

    Args:
      hidden_dim: d_model.
      warmup_steps: steps of the linear warm-up.
      total_steps: the step budget (``train.steps``).
      scale: multiplies the rate (as in :class:`TransformerSchedule`).
      decay_fraction: in (0, 1].
      warmup_fraction: in [0, 1); 0 = the warm-up is counted in steps only.
      hold: ``constant`` or ``rsqrt``: the rate between the warm-up and the decay.
      decay_shape: ``linear`` or ``sqrt``: the curve of the decay.

    Raises:
      ValueError: non-positive sizes, ``decay_fraction`` outside (0, 1],
        ``warmup_fraction`` outside [0, 1), an unknown ``hold`` or ``decay_shape``.
    """

    HOLDS = ("constant", "rsqrt")
    SHAPES = ("linear", "sqrt")

    def __init__(self, hidden_dim, warmup_steps, total_steps, scale=1.0, decay_fraction=1.0,
                 warmup_fraction=0.0, hold="constant", decay_shape="linear"):
        if hidden_dim < 1 or warmup_steps < 1 or total_steps < 1:
            raise ValueError(
                "`hidden_dim`, `warmup_steps` and `total_steps` must be positive. Received: "
                f"hidden_dim={hidden_dim}, warmup_steps={warmup_steps}, "
                f"total_steps={total_steps}.")
        if not 0.0 < decay_fraction <= 1.0:
            raise ValueError(f"`decay_fraction` must be in (0, 1]. Received: {decay_fraction}.")
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(
                f"`warmup_fraction` must be in [0, 1). Received: {warmup_fraction}.")
        if hold not in self.HOLDS:
            raise ValueError(f"`hold` must be one of {self.HOLDS}. Received: {hold!r}.")
        if decay_shape not in self.SHAPES:
            raise ValueError(
                f"`decay_shape` must be one of {self.SHAPES}. Received: {decay_shape!r}.")
        self.hidden_dim = hidden_dim
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.scale = scale
        self.decay_fraction = decay_fraction
        self.warmup_fraction = warmup_fraction
        self.hold = hold
        self.decay_shape = decay_shape
        self.time_progress = keras.Variable(0.0, trainable=False, dtype="float32",
                                            name="time_progress")

    @property
    def peak(self) -> float:
        return self.scale * (float(self.hidden_dim) * float(self.warmup_steps)) ** -0.5

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        progress = ops.maximum(step / float(self.total_steps),
                               ops.convert_to_tensor(self.time_progress, "float32"))
        warmup = step / float(self.warmup_steps)
        if self.warmup_fraction:
            warmup = ops.maximum(warmup, progress / self.warmup_fraction)
        # The share of the decay left: 1 until it begins, exactly 0 at the budget's end.
        left = ops.minimum((1.0 - ops.minimum(progress, 1.0)) / self.decay_fraction, 1.0)
        decay = left if self.decay_shape == "linear" else 1.0 - ops.sqrt(1.0 - left)
        if self.hold == "rsqrt":  # §5.3's rate, scaled down over the decay
            rate = ops.minimum(warmup, ops.rsqrt(step / float(self.warmup_steps)))
            return self.peak * rate * decay
        return self.peak * ops.minimum(warmup, decay)

    def get_config(self):
        return {"hidden_dim": self.hidden_dim, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "scale": self.scale,
                "decay_fraction": self.decay_fraction, "warmup_fraction": self.warmup_fraction,
                "hold": self.hold, "decay_shape": self.decay_shape}
