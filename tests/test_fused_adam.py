"""FusedAdam: the same updates as keras.optimizers.Adam, in TensorFlow's fused kernel."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from aiayn.pipeline.config import load_config  # noqa: E402
from aiayn.pipeline.training import recipe  # noqa: E402
from aiayn.pipeline.training.fused_adam import FusedAdam  # noqa: E402


def _train(optimizer_class, steps=5, **kwargs):
    """Weights, slots and iterations of a tiny model after ``steps`` fixed random batches."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer_class(**kwargs), loss="mse")
    initial = model.weights[0].numpy()
    rng = np.random.default_rng(0)
    for _ in range(steps):
        model.train_on_batch(rng.normal(size=(8, 4)).astype("float32"),
                             rng.normal(size=(8, 2)).astype("float32"))
    slots = [v.numpy() for v in model.optimizer._momentums + model.optimizer._velocities]
    assert not np.allclose(model.weights[0].numpy(), initial)  # it trained
    return [w.numpy() for w in model.weights], slots, int(model.optimizer.iterations.numpy())


@pytest.mark.parametrize("kwargs", [
    {"learning_rate": 0.01, "beta_2": 0.98, "epsilon": 1e-9},
    {"learning_rate": 0.05, "clipnorm": 0.1},
    {"learning_rate": 0.01, "gradient_accumulation_steps": 2},
    {"learning_rate": 0.01, "amsgrad": True},
], ids=["paper", "clipnorm", "accumulation", "amsgrad"])
def test_fused_adam_updates_equal_keras_adam(kwargs):
    keras_weights, keras_slots, keras_iterations = _train(keras.optimizers.Adam, **kwargs)
    fused_weights, fused_slots, fused_iterations = _train(FusedAdam, **kwargs)
    assert fused_iterations == keras_iterations
    for got, want in zip(fused_weights + fused_slots, keras_weights + keras_slots):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)  # float32 order


def test_fused_adam_under_a_strategy_updates_every_replica_alike():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        keras_result = _train(keras.optimizers.Adam, learning_rate=0.01)
    with strategy.scope():
        fused_result = _train(FusedAdam, learning_rate=0.01)
    for got, want in zip(fused_result[0], keras_result[0]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)  # float32 order


def test_the_recipe_uses_it_and_it_round_trips():
    opt = recipe.make_optimizer(load_config(["tiny"], []))
    assert isinstance(opt, FusedAdam)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(opt))
    assert type(clone) is FusedAdam
    assert (clone.beta_1, clone.beta_2, clone.epsilon) == (0.9, 0.98, 1e-9)
