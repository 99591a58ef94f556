"""Canary: the private Keras APIs the project relies on still exist and behave as it assumes.

Keras makes no promise about ``keras.src...`` or underscored attributes; a minor release may
move or change them. Each test here checks one of them on a tiny real Keras model and fails
with a message naming the installed Keras version, what changed, which of our functions uses
it, and the range the project is tested on (``TESTED``, the pin in pyproject.toml).

What we rely on, and where:

==================================================  =============================================
private Keras API                                   used by
==================================================  =============================================
``keras.src.saving.saving_lib.save_weights_only``   pipeline/training/artifacts.py:
``/load_weights_only(..., objects_to_skip=)``       save_model_weights, load_model_weights
  (OSError on a non-HDF5 file, ValueError on        load_trained_model, weights_load_error
  another architecture)
``Model._distribute_strategy``                      pipeline/training/recipe.py:compile_model
``Model._symbolic_build(data_batch=)``              pipeline/training/recipe.py:
``Model._maybe_symbolic_build(iterator,             _prebuild_for_strategy
data_batch)`` (called by ``fit``, overridable)
``Model.train_step(data)`` (overridable on the      pipeline/training/recipe.py:
instance before ``fit``)                            _report_rank1_logs
``Optimizer._iterations`` (the micro-batch counter  pipeline/training/recipe.py:
fed to the schedule under gradient accumulation)    AccumulatedSchedule; callbacks.current_step
``Adam._momentums``, ``_velocities``,               pipeline/training/fused_adam.py:
``_get_variable_index``; ``update_step`` gets the   FusedAdam.update_step
backend's tf.Variable (TensorFlow backend)
``LossScaleOptimizer.inner_optimizer``              pipeline/training/callbacks.py:
                                                    current_learning_rate
``Optimizer._model_variables_moving_average``       pipeline/training/checkpoints.py:
(``use_ema``: in ``trainable_variables`` order;     moving_averages, save_moving_average;
``finalize_variable_values`` called by ``fit``)     fused_adam.py: FusedAdam
``seed_generator_state`` variable paths             pipeline/training/checkpoints.py:
                                                    _seed_generator_states; averaging.py:
                                                    average_weight_files
``Layer._flatten_layers()`` (every nested layer,     pipeline/training/callbacks.py:
the Dropout layers inside custom layers too)        LateDropout
``BackupAndRestore._weights_path``, its file names  pipeline/training/checkpoints.py:
(``latest.weights.h5``, ``training_metadata.json``  ResumableBackup, restored_epoch
with ``epoch``, ``.bkp``) and its constructor
==================================================  =============================================
"""

from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# The Keras versions this file has passed on; keep equal to the pin in pyproject.toml.
TESTED = "keras>=3.12,<3.16"


def _msg(what: str, used_by: str, module: str) -> str:
    return (f"Keras {keras.__version__}: {what} (used by {used_by}); the project is tested on "
            f"{TESTED} — update {module} or narrow the pin")


def _params(func) -> list[str]:
    return list(inspect.signature(func).parameters)


VOCAB, LENGTH = 12, 4


def _dict_model(dropout: float = 0.0) -> keras.Model:
    """A tiny seq2seq-shaped model over the project's feature dict (see dummy_features)."""
    names = ("encoder_token_ids", "encoder_padding_mask", "decoder_token_ids",
             "decoder_padding_mask")
    inputs = {n: keras.Input((None,), dtype="bool" if "mask" in n else "int32", name=n)
              for n in names}
    embed = keras.layers.Embedding(VOCAB, 8, name="embed")
    x = sum(embed(inputs[f"{side}_token_ids"])
            * keras.ops.expand_dims(keras.ops.cast(inputs[f"{side}_padding_mask"], "float32"), -1)
            for side in ("encoder", "decoder"))
    if dropout:
        x = keras.layers.Dropout(dropout, seed=1, name="dropout")(x)
    logits = keras.layers.Dense(VOCAB, name="logits")(x)
    return keras.Model(inputs, logits)


def _batches(n: int, batch: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(n * batch, LENGTH)).astype("int32")
    mask = np.ones_like(ids, dtype=bool)
    features = {"encoder_token_ids": ids, "encoder_padding_mask": mask,
                "decoder_token_ids": ids, "decoder_padding_mask": mask}
    return tf.data.Dataset.from_tensor_slices((features, ids)).batch(batch)


def _compiled(model: keras.Model, optimizer=None) -> keras.Model:
    model.compile(optimizer=optimizer or keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    return model


# --------------------------------------------------------------------------------------------
# keras.src.saving.saving_lib: weights without the optimizer
# --------------------------------------------------------------------------------------------

def test_saving_lib_functions_and_signatures():
    try:
        from keras.src.saving import saving_lib
    except ImportError as err:
        pytest.fail(_msg(f"keras.src.saving.saving_lib cannot be imported ({err})",
                         "aiayn.pipeline.training.artifacts:save_model_weights",
                         "pipeline/training/artifacts.py"))
    for name in ("save_weights_only", "load_weights_only"):
        func = getattr(saving_lib, name, None)
        assert callable(func), _msg(f"saving_lib.{name} is gone",
                                    "aiayn.pipeline.training.artifacts:save_model_weights/"
                                    "load_model_weights", "pipeline/training/artifacts.py")
        params = _params(func)
        assert params[:2] == ["model", "filepath"] and "objects_to_skip" in params, _msg(
            f"saving_lib.{name} takes {params}, not (model, filepath, ..., objects_to_skip)",
            f"aiayn.pipeline.training.artifacts:{'save' if 'save' in name else 'load'}"
            "_model_weights", "pipeline/training/artifacts.py")


def test_weights_round_trip_without_the_optimizer(tmp_path):
    from aiayn.pipeline.training.artifacts import load_model_weights, save_model_weights

    used_by = "aiayn.pipeline.training.artifacts:save_model_weights/load_model_weights"
    module = "pipeline/training/artifacts.py"
    model = _compiled(_dict_model())
    # The optimizer now has slots and iterations.
    model.fit(_batches(2), epochs=1, verbose=0, shuffle=False)
    assert int(model.optimizer.iterations) == 2
    path = save_model_weights(model, tmp_path / "w.weights.h5")
    assert path.is_file(), _msg("save_weights_only(objects_to_skip=[optimizer]) wrote no file",
                                used_by, module)

    import h5py

    with h5py.File(path, "r") as f:
        stored = []
        f.visit(stored.append)
    assert stored and not [k for k in stored if "optimizer" in k], _msg(
        f"objects_to_skip=[model.optimizer] no longer leaves the optimizer out of the file "
        f"(stored: {stored})", used_by, module)

    fresh = _dict_model()
    fresh.set_weights([np.zeros_like(w) for w in fresh.get_weights()])
    load_model_weights(fresh, path)
    for a, b in zip(model.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b, err_msg=_msg(
            "load_weights_only does not restore the weights save_weights_only wrote",
            used_by, module))

    compiled = _compiled(_dict_model())  # a model with an optimizer, as during training
    compiled.optimizer.build(compiled.trainable_variables)
    load_model_weights(compiled, path)
    assert int(compiled.optimizer.iterations) == 0, _msg(
        "load_weights_only(objects_to_skip=[optimizer]) touched the optimizer's state",
        used_by, module)
    for a, b in zip(model.get_weights(), compiled.get_weights()):
        np.testing.assert_array_equal(a, b, err_msg=_msg(
            "load_weights_only(objects_to_skip=[optimizer]) did not load the model's weights",
            used_by, module))


def test_weights_load_errors_are_oserror_and_valueerror(tmp_path):
    """`weights_load_error` turns these two exception types into one-line user errors."""
    from aiayn.pipeline.training.artifacts import load_model_weights, save_model_weights

    used_by = "aiayn.pipeline.training.artifacts:load_trained_model/weights_load_error"
    module = "pipeline/training/artifacts.py"
    junk = tmp_path / "junk.weights.h5"
    junk.write_text("not HDF5")
    model = _dict_model()
    with pytest.raises(OSError):
        try:
            load_model_weights(model, junk)
        except OSError:
            raise
        except Exception as err:  # noqa: BLE001 - name what it raises now
            pytest.fail(_msg(f"a non-HDF5 weights file raises {type(err).__name__}, not OSError",
                             used_by, module))

    path = save_model_weights(model, tmp_path / "small.weights.h5")
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="x")])
    with pytest.raises(ValueError):
        try:
            load_model_weights(other, path)
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001
            pytest.fail(_msg(f"weights of another architecture raise {type(err).__name__}, not "
                             "ValueError", used_by, module))


# --------------------------------------------------------------------------------------------
# Distribution: _distribute_strategy, _symbolic_build, _maybe_symbolic_build
# --------------------------------------------------------------------------------------------

def test_distribute_strategy_attribute():
    used_by = "aiayn.pipeline.training.recipe:compile_model"
    module = "pipeline/training/recipe.py"
    plain = _dict_model()
    assert hasattr(plain, "_distribute_strategy"), _msg(
        "Model._distribute_strategy is gone", used_by, module)
    assert plain._distribute_strategy is None, _msg(
        f"Model._distribute_strategy is {plain._distribute_strategy!r} for a model built outside "
        "any strategy (expected None)", used_by, module)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        scoped = _dict_model()
    assert scoped._distribute_strategy is strategy, _msg(
        "Model._distribute_strategy is not the strategy whose scope built the model",
        used_by, module)


def test_symbolic_build_signatures():
    used_by = "aiayn.pipeline.training.recipe:_prebuild_for_strategy"
    module = "pipeline/training/recipe.py"
    for name in ("_symbolic_build", "_maybe_symbolic_build"):
        assert callable(getattr(keras.Model, name, None)), _msg(
            f"keras.Model.{name} is gone", used_by, module)
    params = _params(keras.Model._symbolic_build)
    assert "data_batch" in params, _msg(
        f"Model._symbolic_build takes {params}, without data_batch", used_by, module)
    params = _params(keras.Model._maybe_symbolic_build)
    assert params == ["self", "iterator", "data_batch"], _msg(
        f"Model._maybe_symbolic_build takes {params}; our replacement takes "
        "(iterator=None, data_batch=None)", used_by, module)


def test_prebuild_for_strategy_builds_everything_and_fit_uses_the_override():
    """What _prebuild_for_strategy assumes: `_symbolic_build(data_batch=)` inside the scope
    builds the model, compiled loss and metrics; `fit` then calls the instance's
    `_maybe_symbolic_build` (our no-op), and trains on dict features under the strategy."""
    from aiayn.pipeline.training.recipe import _prebuild_for_strategy

    used_by = "aiayn.pipeline.training.recipe:_prebuild_for_strategy"
    module = "pipeline/training/recipe.py"
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = _compiled(_dict_model())
        model.optimizer.build(model.trainable_variables)
    _prebuild_for_strategy(model)
    unbuilt = [m.name for m in model.metrics if getattr(m, "built", True) is False]
    unbuilt += [] if model.built else [model.name]
    assert not unbuilt, _msg(f"Model._symbolic_build(data_batch=...) left {unbuilt} unbuilt",
                             used_by, module)

    calls = []
    noop = model._maybe_symbolic_build
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: (
        calls.append((iterator, data_batch)), noop(iterator, data_batch))[1]
    history = model.fit(_batches(2), epochs=1, verbose=0, shuffle=False)
    assert calls, _msg("fit no longer calls Model._maybe_symbolic_build (the override that "
                       "keeps it from consuming a batch is dead code)", used_by, module)
    assert {"loss", "accuracy"} <= set(history.history), _msg(
        f"fit under MirroredStrategy after _symbolic_build logged {sorted(history.history)}",
        used_by, module)


# --------------------------------------------------------------------------------------------
# train_step overridden on the instance
# --------------------------------------------------------------------------------------------

def test_train_step_can_be_wrapped_on_the_instance():
    used_by = "aiayn.pipeline.training.recipe:_report_rank1_logs"
    module = "pipeline/training/recipe.py"
    params = _params(keras.Model.train_step)
    assert params == ["self", "data"], _msg(f"Model.train_step takes {params}, not (self, data)",
                                            used_by, module)
    model = _compiled(_dict_model())
    original, seen = model.train_step, []

    def train_step(data):
        logs = original(data)
        seen.append(sorted(logs))
        return {k: keras.ops.expand_dims(v, 0) for k, v in logs.items()}

    model.train_step = train_step
    history = model.fit(_batches(2), epochs=1, verbose=0, shuffle=False)
    assert seen, _msg("fit ignores a train_step set on the model instance", used_by, module)
    assert "loss" in seen[0], _msg(f"train_step returns {seen[0]}, without `loss`",
                                   used_by, module)
    assert np.size(history.history["loss"][-1]) == 1, _msg(
        "logs of shape (1,) from train_step do not come back as one value per epoch",
        used_by, module)


# --------------------------------------------------------------------------------------------
# Optimizers: _iterations under gradient accumulation, LossScaleOptimizer.inner_optimizer
# --------------------------------------------------------------------------------------------

@keras.saving.register_keras_serializable(package="aiayn_test")
class _StepAsRate(keras.optimizers.schedules.LearningRateSchedule):
    """learning rate = the step the optimizer passes (to see which counter it is)."""

    def __call__(self, step):
        return keras.ops.cast(step, "float32")

    def get_config(self):
        return {}


def _apply(optimizer, times: int) -> None:
    var = keras.Variable(np.zeros(2, "float32"))
    for _ in range(times):
        optimizer.apply([keras.ops.ones(2)], [var])


def test_schedule_gets_the_micro_batch_counter_under_accumulation():
    from aiayn.pipeline.training.recipe import AccumulatedSchedule

    used_by = "aiayn.pipeline.training.recipe:AccumulatedSchedule"
    module = "pipeline/training/recipe.py"
    plain = keras.optimizers.Adam(learning_rate=_StepAsRate(), gradient_accumulation_steps=2)
    _apply(plain, 4)
    assert int(plain._iterations) == 4 and int(plain.iterations) == 2, _msg(
        f"with gradient_accumulation_steps=2, 4 micro-batches give _iterations="
        f"{int(plain._iterations)}, iterations={int(plain.iterations)} (expected 4 and 2)",
        "aiayn.pipeline.training.callbacks:current_step", "pipeline/training/callbacks.py")
    assert float(plain.learning_rate) == 4.0, _msg(
        f"the schedule is called with {float(plain.learning_rate)}, not the micro-batch counter "
        "_iterations (4): AccumulatedSchedule would divide the update step again",
        used_by, module)
    wrapped = keras.optimizers.Adam(learning_rate=AccumulatedSchedule(_StepAsRate(), 2),
                                    gradient_accumulation_steps=2)
    _apply(wrapped, 4)
    assert float(wrapped.learning_rate) == float(wrapped.iterations) == 2.0, _msg(
        f"AccumulatedSchedule feeds the schedule {float(wrapped.learning_rate)}, not the update "
        f"step {int(wrapped.iterations)}", used_by, module)


def test_adam_slots_and_update_step_arguments():
    used_by = "aiayn.pipeline.training.fused_adam:FusedAdam.update_step"
    module = "pipeline/training/fused_adam.py"
    seen = []

    class Spy(keras.optimizers.Adam):
        def update_step(self, gradient, variable, learning_rate):
            index = self._get_variable_index(variable)
            seen.append((variable, self._momentums[index], self._velocities[index]))
            return super().update_step(gradient, variable, learning_rate)

    model = _compiled(_dict_model(), optimizer=Spy(0.01))
    model.optimizer.build(model.trainable_variables)
    model.optimizer.apply_gradients(
        [(tf.ones_like(v.value), v) for v in model.trainable_variables])
    assert seen, _msg("Adam.update_step was not called by apply_gradients", used_by, module)
    for variable, m, v in seen:
        assert isinstance(variable, tf.Variable), _msg(
            f"update_step got a {type(variable).__name__}, not the backend's tf.Variable",
            used_by, module)
        assert m.shape == v.shape == variable.shape and hasattr(m.value, "handle"), _msg(
            "Adam._momentums/_velocities[_get_variable_index(variable)] are not the variable's "
            "slots", used_by, module)


def test_loss_scale_optimizer_inner_optimizer():
    from aiayn.pipeline.training.callbacks import current_learning_rate, current_step

    used_by = "aiayn.pipeline.training.callbacks:current_learning_rate"
    module = "pipeline/training/callbacks.py"
    lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.25))
    assert isinstance(getattr(lso, "inner_optimizer", None), keras.optimizers.Adam), _msg(
        "LossScaleOptimizer.inner_optimizer is gone or not the wrapped optimizer", used_by, module)
    model = _compiled(_dict_model(), optimizer=lso)
    model.optimizer.build(model.trainable_variables)
    assert current_learning_rate(model) == pytest.approx(0.25), _msg(
        "the learning rate read through LossScaleOptimizer.inner_optimizer is not the inner "
        "optimizer's", used_by, module)
    for _ in range(3):
        lso.apply([keras.ops.ones_like(v) for v in model.trainable_variables],
                  model.trainable_variables)
    assert current_step(model) == 3, _msg(
        f"LossScaleOptimizer.iterations is {current_step(model)} after 3 finite updates",
        "aiayn.pipeline.training.callbacks:current_step", module)


def test_optimizer_moving_average_slots_and_the_end_of_fit(tmp_path):
    """Keras's EMA: ``average = w`` after the first update, then ``m * average + (1 - m) * w``,
    in ``_model_variables_moving_average``; FusedAdam keeps the trained weights at the end of
    ``fit``, and the average written to a file is that recursion."""
    from aiayn.pipeline.training.artifacts import load_model_weights
    from aiayn.pipeline.training.checkpoints import moving_averages, save_moving_average
    from aiayn.pipeline.training.fused_adam import FusedAdam

    used_by = "aiayn.pipeline.training.checkpoints:moving_averages"
    module = "pipeline/training/checkpoints.py"
    momentum = 0.75
    model = _compiled(_dict_model(), optimizer=FusedAdam(0.05, use_ema=True,
                                                         ema_momentum=momentum))
    trained = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: trained.append(
        [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]))
    model.fit(_batches(4), epochs=1, verbose=0, callbacks=[record])
    expected = [np.array(w) for w in trained[0]]
    for weights in trained[1:]:
        expected = [momentum * e + (1 - momentum) * w for e, w in zip(expected, weights)]
    averages = moving_averages(model)
    assert averages is not None, _msg(
        "Optimizer._model_variables_moving_average is gone or not one per trainable variable",
        used_by, module)
    for average, want in zip(averages, expected):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(average), want, rtol=1e-5,
                                   atol=1e-7, err_msg=_msg(
                                       "the optimizer's moving average is not Keras's recursion "
                                       "in trainable_variables order", used_by, module))
    for variable, last in zip(model.trainable_variables, trained[-1]):  # not the average
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), last)
    assert not np.allclose(expected[0], trained[-1][0])

    path = save_moving_average(model, tmp_path / "ema.weights.h5")
    for variable, last in zip(model.trainable_variables, trained[-1]):  # given back
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), last)
    fresh = _dict_model()
    load_model_weights(fresh, path)
    for variable, want in zip(fresh.trainable_variables, expected):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), want, rtol=1e-5,
                                   atol=1e-7)


# --------------------------------------------------------------------------------------------
# Dropout RNG state: variables whose path ends with seed_generator_state
# --------------------------------------------------------------------------------------------

def test_seed_generator_state_variables():
    from aiayn.pipeline.training.checkpoints import _seed_generator_states

    used_by = ("aiayn.pipeline.training.checkpoints:_seed_generator_states, "
               "aiayn.pipeline.training.averaging:average_weight_files")
    module = "pipeline/training/checkpoints.py and pipeline/training/averaging.py"
    model = _dict_model(dropout=0.5)
    states = _seed_generator_states(model)
    paths = [v.path for v in model.variables]
    assert states, _msg(f"no model variable path ends with 'seed_generator_state' for a "
                        f"Dropout layer (paths: {paths})", used_by, module)
    before = [keras.ops.convert_to_numpy(v) for v in states]
    model(next(iter(_batches(1)))[0], training=True)  # dropout draws: the state advances
    after = [keras.ops.convert_to_numpy(v) for v in states]
    assert any((a != b).any() for a, b in zip(before, after)), _msg(
        "a training call does not advance the seed_generator_state variables (the RNG state "
        "lives elsewhere; the backup would not restore dropout)", used_by, module)
    for v, value in zip(states, before):
        v.assign(value)
    assert all((keras.ops.convert_to_numpy(v) == b).all() for v, b in zip(states, before)), _msg(
        "seed_generator_state variables cannot be restored with assign", used_by, module)


# --------------------------------------------------------------------------------------------
# BackupAndRestore internals: ResumableBackup and restored_epoch
# --------------------------------------------------------------------------------------------

def test_backup_and_restore_files_and_resume(tmp_path):
    from aiayn.pipeline.training.checkpoints import ResumableBackup, restored_epoch

    used_by = "aiayn.pipeline.training.checkpoints:ResumableBackup/restored_epoch"
    module = "pipeline/training/checkpoints.py"
    params = _params(keras.callbacks.BackupAndRestore.__init__)
    assert {"backup_dir", "save_freq", "double_checkpoint", "delete_checkpoint"} <= set(params), \
        _msg(f"BackupAndRestore takes {params}", used_by, module)
    backup = tmp_path / "backup"
    callback = ResumableBackup(backup)
    assert Path(getattr(callback, "_weights_path", "")) == backup / "latest.weights.h5", _msg(
        f"BackupAndRestore._weights_path is {getattr(callback, '_weights_path', None)!r}, not "
        "<backup_dir>/latest.weights.h5", used_by, module)

    model = _compiled(_dict_model(dropout=0.1))
    model.fit(_batches(2), epochs=2, verbose=0, shuffle=False, callbacks=[callback])
    names = sorted(p.name for p in backup.iterdir())
    expected = {"latest.weights.h5", "training_metadata.json", "latest.weights.h5.bkp",
                "training_metadata.json.bkp", "extra_state.npz"}
    assert expected <= set(names), _msg(
        f"the backup directory holds {names}, not {sorted(expected)}", used_by, module)
    meta = json.loads((backup / "training_metadata.json").read_text())
    assert meta.get("epoch") == 2 and restored_epoch(backup) == 2, _msg(
        f"training_metadata.json after 2 epochs is {meta} (restored_epoch expects epoch: 2, "
        "the number of finished epochs)", used_by, module)

    resumed, epochs_run = _compiled(_dict_model(dropout=0.1)), []
    counter = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epochs_run.append(e))
    resumed.fit(_batches(2), epochs=3, verbose=0, shuffle=False,
                callbacks=[ResumableBackup(backup), counter])
    assert epochs_run == [2], _msg(
        f"resuming from the backup ran epochs {epochs_run}, not [2]", used_by, module)


def test_installed_keras_is_in_the_tested_range():
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(re.sub(r"^keras", "", TESTED))
    assert keras.__version__ in spec, (
        f"Keras {keras.__version__} is outside {TESTED}, the range this file has passed on: if "
        "every test above passes, widen TESTED and the pin in pyproject.toml; otherwise update "
        "the modules named in the failures")


# --------------------------------------------------------------------------------------------
# Layer._flatten_layers: the Dropout layers inside nested custom layers
# --------------------------------------------------------------------------------------------

def test_flatten_layers_reaches_dropout_layers_nested_in_custom_layers():
    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dropout(0.3, name="inner_dropout")

        def call(self, x, training=None):
            return self.inner(x, training=training)

    model = keras.Sequential([keras.Input((4,)), Block(name="block"),
                              keras.layers.Dropout(0.2, name="outer_dropout")])
    flatten = getattr(model, "_flatten_layers", None)
    assert callable(flatten), _msg("Layer._flatten_layers is gone",
                                   "aiayn.pipeline.training.callbacks:LateDropout",
                                   "pipeline/training/callbacks.py")
    names = sorted(layer.name for layer in flatten() if isinstance(layer, keras.layers.Dropout))
    assert names == ["inner_dropout", "outer_dropout"], _msg(
        f"Layer._flatten_layers() found the Dropout layers {names}, not the nested one too",
        "aiayn.pipeline.training.callbacks:LateDropout", "pipeline/training/callbacks.py")
