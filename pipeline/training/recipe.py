"""The paper's training recipe (§5) as Keras objects: schedule, optimizer, loss, compile.

Recipe (Vaswani et al., 2017, §5): Adam with beta_1=0.9, beta_2=0.98, epsilon=1e-9; learning rate
``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (§5.3, ``TransformerSchedule``); label
smoothing 0.1 over real target tokens (§5.4); gradient accumulation (``gradient_accumulation_steps``
of the Keras 3 optimizer) to reach large effective batches on small hardware.

Two Keras workarounds live here, both private API (``Model._symbolic_build`` and a wrapped
``train_step``); tests/test_keras_private_api.py fails with the Keras version named if they move.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from aiayn.models.losses import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy
from aiayn.models.schedule import BudgetSchedule, TransformerSchedule
from aiayn.pipeline.config import Config
from aiayn.pipeline.training.artifacts import dummy_features
from aiayn.pipeline.training.callbacks import TargetTokens
from aiayn.pipeline.training.fused_adam import FusedAdam


@keras.saving.register_keras_serializable(package="aiayn")
class AccumulatedSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Feeds ``schedule`` the update step when gradients are accumulated.

    Keras 3 optimizers call the schedule with the *micro-batch* counter (``_iterations``), which
    runs ``accumulation_steps`` times faster than the update step the paper's warmup counts.
    """

    def __init__(self, schedule, accumulation_steps: int):
        self.schedule = schedule
        self.accumulation_steps = int(accumulation_steps)

    def __call__(self, step):
        return self.schedule(keras.ops.floor_divide(step, self.accumulation_steps))

    def get_config(self):
        return {"schedule": keras.saving.serialize_keras_object(self.schedule),
                "accumulation_steps": self.accumulation_steps}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config["schedule"]),
                   config["accumulation_steps"])


# The schedules that end at the budget, and what the rate does before their decay.
_BUDGET_HOLDS = {"budget": "constant", "rsqrt_cooldown": "rsqrt"}


def make_schedule(cfg: Config):
    """``train.lr_schedule``: §5.3's (``rsqrt``), a linear decay to zero at the budget
    (``budget``), or §5.3's with that decay over the budget's last ``train.decay_fraction``
    (``rsqrt_cooldown``); with ``train.learning_rate_scale``, accumulation-aware."""
    t = cfg.train
    if t.lr_schedule in _BUDGET_HOLDS:
        schedule = BudgetSchedule(cfg.model.hidden_dim, t.warmup_steps, t.steps,
                                  scale=t.learning_rate_scale, decay_fraction=t.decay_fraction,
                                  warmup_fraction=t.warmup_fraction,
                                  hold=_BUDGET_HOLDS[t.lr_schedule],
                                  decay_shape=t.decay_shape)
    else:
        schedule = TransformerSchedule(cfg.model.hidden_dim, t.warmup_steps,
                                       scale=t.learning_rate_scale)
    accum = t.gradient_accumulation_steps
    return AccumulatedSchedule(schedule, accum) if accum > 1 else schedule


def time_progress_variable(optimizer: keras.optimizers.Optimizer):
    """The variable a time budget writes its spent share into (``BudgetSchedule``), or None."""
    schedule = getattr(optimizer, "inner_optimizer", optimizer)._learning_rate
    schedule = getattr(schedule, "schedule", schedule)  # inside AccumulatedSchedule
    return getattr(schedule, "time_progress", None)


def make_optimizer(cfg: Config) -> keras.optimizers.Optimizer:
    """Adam(beta_1, beta_2, epsilon) on the §5.3 schedule, with gradient accumulation and the
    weights' moving average (Keras's Adam, each variable's update in one fused TensorFlow kernel:
    ``fused_adam.py``)."""
    t = cfg.train
    accum = t.gradient_accumulation_steps
    return FusedAdam(
        learning_rate=make_schedule(cfg), beta_1=t.beta_1, beta_2=t.beta_2, epsilon=t.epsilon,
        clipnorm=t.clipnorm or None, gradient_accumulation_steps=accum if accum > 1 else None,
        use_ema=t.ema_momentum > 0, ema_momentum=t.ema_momentum or 0.99)


def make_loss_and_metrics(cfg: Config, pad_id: int, output_ids=None):
    """The loss and metrics of ``cfg.train``; ``output_ids``: the model's (its logits' columns)."""
    loss = MaskedLabelSmoothedCrossEntropy(label_smoothing=cfg.train.label_smoothing,
                                           pad_id=pad_id, output_ids=output_ids)
    return loss, [MaskedAccuracy(pad_id=pad_id, output_ids=output_ids),
                  TargetTokens(pad_id=pad_id)]


def compile_model(model: keras.Model, cfg: Config, pad_id: int, jit_compile: bool,
                  policy: str) -> None:
    optimizer = make_optimizer(cfg)
    if policy == "mixed_float16":
        # Dynamic loss scaling keeps float16 gradients from underflowing.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    loss, metrics = make_loss_and_metrics(cfg, pad_id, getattr(model, "output_ids", None))
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=jit_compile)
    model.optimizer.build(model.trainable_variables)
    if getattr(model, "_distribute_strategy", None) is not None:
        _prebuild_for_strategy(model)
    if isinstance(model.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
        _report_rank1_logs(model)


def _report_rank1_logs(model: keras.Model) -> None:
    """Works around Keras 3 + MultiWorkerMirroredStrategy (tensorflow/tensorflow#72388).

    Keras reduces the per-replica step logs with ``strategy.reduce("MEAN", v, axis=0)``, which
    fails on scalar metrics. Returning each log as shape ``(1,)`` makes that reduction the mean
    over replicas, a scalar again. Token counts are scaled by the replica count first, so their
    mean is the global sum.
    """
    original = model.train_step
    replicas = model.distribute_strategy.num_replicas_in_sync

    def train_step(data):
        logs = original(data)
        return {k: keras.ops.expand_dims(v * replicas if k == "target_tokens" else v, 0)
                for k, v in logs.items()}

    model.train_step = train_step


def _prebuild_for_strategy(model: keras.Model) -> None:
    """Builds the compiled loss and metrics now, from a local dummy batch.

    Under a non-default strategy, Keras 3's TF trainer (`_maybe_symbolic_build`, 3.15) pulls
    one batch from the distributed iterator to build them, which (a) fails for dict features
    (it tries to reduce the `PerReplica` dict) and (b) silently consumes a batch, shifting the
    data position that resumption relies on. With everything built here, that step has nothing
    left to do, so it is skipped for this model.
    """
    features = dummy_features()
    labels = features["decoder_token_ids"]
    with model.distribute_strategy.scope():
        model._symbolic_build(data_batch=(features, labels))
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
