"""Training callbacks on small stand-in models: checkpoints, averaging, dev BLEU, budgets."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from aiayn.pipeline.training import artifacts, checkpoints  # noqa: E402
from aiayn.pipeline.training import callbacks as cb  # noqa: E402
from aiayn.pipeline.training.averaging import average_weight_files  # noqa: E402
from aiayn.pipeline.training.dev_bleu import DevEvaluator  # noqa: E402


def _dense_model(seed: int = 0) -> keras.Model:
    # Seeded initialiser, not keras.utils.set_random_seed: seeding TensorFlow in eager mode
    # destroys the SentencePiece resources of tokenizers that other tests share.
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(2, name="dense",
                           kernel_initializer=keras.initializers.GlorotUniform(seed=seed)),
        keras.layers.Dropout(0.1, seed=seed, name="dropout")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def _fit(model, steps: int, callbacks, steps_per_epoch: int | None = None):
    import tensorflow as tf

    x = np.ones((4, 3), "float32")
    y = np.zeros((4, 2), "float32")
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    spe = steps_per_epoch or steps
    model.fit(ds, epochs=-(-steps // spe), steps_per_epoch=spe, callbacks=callbacks, verbose=0,
              shuffle=False)


def test_average_weight_files_is_the_mean_of_known_weights(tmp_path):
    model = _dense_model()
    paths = []
    for i, value in enumerate((1.0, 2.0, 6.0)):
        model.get_layer("dense").set_weights([np.full((3, 2), value, "float32"),
                                              np.arange(2, dtype="float32") * value])
        paths.append(artifacts.save_model_weights(model, tmp_path / f"ckpt-{i}.weights.h5"))
    model.get_layer("dense").set_weights([np.zeros((3, 2), "float32"), np.zeros(2, "float32")])
    average_weight_files(model, paths)
    kernel, bias = model.get_layer("dense").get_weights()
    np.testing.assert_allclose(kernel, np.full((3, 2), 3.0))
    np.testing.assert_allclose(bias, [0.0, 3.0])
    with pytest.raises(ValueError, match="at least one"):
        average_weight_files(model, [])


def test_model_weight_files_skip_the_optimizer_and_load_into_an_uncompiled_model(tmp_path):
    import h5py

    model = _dense_model()
    _fit(model, 2, [])
    path = artifacts.save_model_weights(model, tmp_path / "m.weights.h5")
    with h5py.File(path) as f:
        assert "optimizer" not in f
    fresh = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense"),
                              keras.layers.Dropout(0.1, name="dropout")])
    artifacts.load_model_weights(fresh, path)
    np.testing.assert_array_equal(fresh.get_layer("dense").get_weights()[0],
                                  model.get_layer("dense").get_weights()[0])


def test_step_checkpoints_every_n_steps_keep_the_last_k(tmp_path):
    model = _dense_model()
    _fit(model, 12, [cb.Budget(max_steps=9),
                     checkpoints.StepCheckpoints(tmp_path, every=2, keep=3)], steps_per_epoch=4)
    steps = [s for s, _ in artifacts.list_checkpoints(tmp_path)]
    # 2, 4, 6, 8 and the final 9; the last three are kept.
    assert steps == [6, 8, 9]


def test_budget_stops_at_the_step_budget_and_at_the_time_budget():
    model = _dense_model()
    budget = cb.Budget(max_steps=5)
    _fit(model, 50, [budget], steps_per_epoch=3)
    assert cb.current_step(model) == 5 and budget.reason == "steps"

    class FrozenClock(cb.TrainingClock):
        def elapsed(self):
            return 61.0

    model = _dense_model()
    budget = cb.Budget(max_steps=50, clock=FrozenClock(budget_minutes=1.0))
    _fit(model, 50, [budget], steps_per_epoch=10)
    assert cb.current_step(model) == 1 and budget.reason == "time"


def _frozen_weights_dropout_model(rate: float) -> keras.Model:
    """A model whose training loss varies only through its dropout (learning rate 0)."""
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(8, kernel_initializer="ones", name="dense"),
        keras.layers.Dropout(rate, seed=1, name="dropout"),
        keras.layers.Dense(1, kernel_initializer="ones", name="out")])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    return model


def _batch_losses(model, steps: int, callbacks) -> list[float]:
    losses = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float(logs["loss"]))  # one batch an epoch: the batch's own loss

    _fit(model, steps, [*callbacks, Record()], steps_per_epoch=1)
    return losses


def test_late_dropout_trains_without_dropout_for_its_share_of_the_steps_then_with_it():
    model = _frozen_weights_dropout_model(0.5)
    stream = io.StringIO()
    late = cb.LateDropout(0.4, max_steps=10, stream=stream)
    losses = _batch_losses(model, 10, [late])
    # Steps 1-4 (40% of 10) without dropout: the same loss each time, that of no dropout
    # (all-ones weights: 3 * 8 = 24 from ones, squared). From step 5 dropout changes it.
    assert losses[:4] == [576.0] * 4
    assert len(set(losses[4:])) > 1 and all(loss != 576.0 for loss in losses[4:])
    assert late.enabled_at == 4
    assert stream.getvalue() == "step 4: dropout on (0.5) after 0.4 of the run.\n"
    assert model.get_layer("dropout").rate == 0.5


def test_late_dropout_counts_the_time_budget_when_it_is_further_along():
    class Clock(cb.TrainingClock):
        def __init__(self):
            super().__init__(budget_minutes=2.0)
            self.now = 0.0

        def elapsed(self):
            return self.now

    clock = Clock()

    class Tick(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            clock.now += 20.0  # each step: 20 s of a 2-minute budget (1/6)

    late = cb.LateDropout(0.3, max_steps=100, clock=clock, stream=io.StringIO())
    losses = _batch_losses(_frozen_weights_dropout_model(0.5), 6, [late, Tick()])
    # 2 steps = 40 s = 1/3 of the budget >= 0.3: on from the third step (steps alone: the 31st).
    assert late.enabled_at == 2 and losses[:2] == [576.0] * 2 and 576.0 not in losses[2:]


def test_late_dropout_that_never_switched_leaves_the_model_with_its_rates():
    model = _frozen_weights_dropout_model(0.5)
    late = cb.LateDropout(0.9, max_steps=100, stream=io.StringIO())
    assert _batch_losses(model, 3, [late]) == [576.0] * 3
    assert late.enabled_at is None and model.get_layer("dropout").rate == 0.5
    # The next fit, without the callback, trains with dropout: the train step was rebuilt.
    assert 576.0 not in _batch_losses(model, 3, [])
    # A run resumed past the share has dropout from its first step.
    late = cb.LateDropout(0.01, max_steps=100, stream=io.StringIO())
    assert 576.0 not in _batch_losses(model, 2, [late]) and late.enabled_at is None


class _ScriptedTranslator:
    """Returns scripted hypotheses: perfect, then worse and worse (a degrading model)."""

    def __init__(self, references):
        self.references = references
        self.calls = 0

    def __call__(self, sources):
        self.calls += 1
        if self.calls == 1:
            return [self.references[0]] + ["nothing here"] * (len(sources) - 1)  # half right
        if self.calls == 2:
            return list(self.references)  # perfect: BLEU 100
        return ["nothing here"] * len(sources)


def test_budget_progress_feeds_the_spent_share_of_the_time_budget():
    class Clock(cb.TrainingClock):
        def __init__(self):
            super().__init__(budget_minutes=2.0)
            self.now = 0.0

        def elapsed(self):
            self.now += 30.0  # each batch: 30 s of a 2-minute budget
            return self.now

    variable = keras.Variable(0.0, trainable=False)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(keras.ops.convert_to_numpy(variable)))

    progress = cb.BudgetProgress(variable, clock=Clock())
    _fit(_dense_model(), 6, [progress, Record()])
    assert seen == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_dev_loss_is_the_training_loss_per_real_token_on_the_dev_pairs(tmp_path):
    from aiayn.models.losses import MaskedLabelSmoothedCrossEntropy
    from aiayn.pipeline.training.dev_loss import DevLoss

    pad = 0
    labels = np.array([[3, 4, pad], [5, pad, pad]], "int32")
    logits = np.random.default_rng(0).normal(size=(2, 3, 6)).astype("float32")

    class Fixed(keras.Model):  # known logits: those of the rows the features name
        def call(self, features, training=False):
            return keras.ops.take(keras.ops.convert_to_tensor(logits), features["row"], axis=0)

    loss = MaskedLabelSmoothedCrossEntropy(0.1, pad_id=pad)
    batches = [({"row": np.array([0])}, labels[:1]), ({"row": np.array([1])}, labels[1:])]
    history = cb.RunHistory(tmp_path)
    dev_loss = DevLoss(batches, loss, pad, every=2, history=history)
    model = _dense_model()
    dev_loss.set_model(Fixed())
    dev_loss.on_train_begin()
    expected = float(loss(labels, logits))  # the mean over the 3 real tokens
    np.testing.assert_allclose(dev_loss.measure(), expected, rtol=1e-5)
    # Recorded every 2 optimizer steps of a real fit, into the history rows.
    dev_loss = DevLoss(batches, loss, pad, every=2, history=history)
    dev_loss.measure = lambda: 1.5
    _fit(model, 5, [dev_loss])
    assert dev_loss.results == [(2, 1.5), (4, 1.5)]
    assert [r["dev_loss"] for r in history.rows] == [1.5, 1.5]
    assert json.loads((tmp_path / "history.json").read_text())["rows"][-1]["step"] == 4


def test_dev_evaluator_scores_tracks_the_best_and_stops_early(tmp_path):
    references = ["the cat sat on the mat", "a dog ran in the park"]
    sources = ["le chat", "un chien"]
    model = _dense_model()
    history = cb.RunHistory(tmp_path)
    stream = io.StringIO()

    class Snapshot(keras.callbacks.Callback):
        """Records the dense kernel at every step to compare with best.weights.h5."""

        def __init__(self):
            super().__init__()
            self.kernels = {}

        def on_train_batch_end(self, batch, logs=None):
            self.kernels[cb.current_step(self.model)] = \
                self.model.get_layer("dense").get_weights()[0].copy()

    snapshot = Snapshot()
    evaluator = DevEvaluator(_ScriptedTranslator(references), sources, references, every=2,
                                best_path=tmp_path / "best.weights.h5", patience=2,
                                history=history, state_path=tmp_path / "dev_state.json",
                                stream=stream)
    _fit(model, 40, [snapshot, evaluator], steps_per_epoch=5)

    bleus = [r["bleu"] for r in evaluator.results]
    assert [r["step"] for r in evaluator.results] == [2, 4, 6, 8]
    assert bleus[1] == pytest.approx(100.0)
    assert 0.0 < bleus[0] < 100.0 and bleus[2] == bleus[3] == 0.0
    # Two evaluations without gain after step 4: training stops at step 8.
    assert evaluator.stopped_early and cb.current_step(model) == 8
    assert evaluator.best_step == 4 and evaluator.best_bleu == pytest.approx(100.0)
    best = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense"),
                             keras.layers.Dropout(0.1, name="dropout")])
    artifacts.load_model_weights(best, tmp_path / "best.weights.h5")
    np.testing.assert_array_equal(best.get_layer("dense").get_weights()[0], snapshot.kernels[4])
    rows = {r["step"]: r for r in json.loads((tmp_path / "history.json").read_text())["rows"]}
    assert rows[4]["dev_bleu"] == pytest.approx(100.0) and "dev_chrf" in rows[4]
    state = json.loads((tmp_path / "dev_state.json").read_text())
    assert state["best_step"] == 4
    assert "early stopping" in stream.getvalue()


def test_dev_evaluator_resumes_best_and_patience_from_its_state(tmp_path):
    references = ["the cat sat on the mat"]
    state = {"results": [{"step": 2, "bleu": 10.0, "chrf": 1.0},
                         {"step": 4, "bleu": 5.0, "chrf": 1.0},
                         {"step": 6, "bleu": 50.0, "chrf": 1.0}]}  # step 6: lost future
    (tmp_path / "dev_state.json").write_text(json.dumps(state))
    model = _dense_model()
    _fit(model, 4, [])  # the restored model is at step 4
    evaluator = DevEvaluator(lambda s: ["x"] * len(s), ["src"], references, every=0,
                                patience=2, state_path=tmp_path / "dev_state.json")
    evaluator.set_model(model)
    evaluator.on_train_begin()
    assert [r["step"] for r in evaluator.results] == [2, 4]
    assert (evaluator.best_bleu, evaluator.best_step, evaluator.bad_evals) == (10.0, 2, 1)


def test_target_tokens_counts_real_tokens_and_progress_reports_tokens_per_second(tmp_path):
    metric = cb.TargetTokens(pad_id=0)
    metric.update_state(np.array([[5, 6, 0], [7, 0, 0]]))
    assert float(metric.result()) == 3.0
    assert cb.TargetTokens.from_config(metric.get_config()).pad_id == 0

    model = _dense_model()
    stream = io.StringIO()
    history = cb.RunHistory(tmp_path)
    clock = cb.TrainingClock(budget_minutes=1.0)
    progress = cb.ProgressLogger(6, history, clock, log_every=2, every_s=0.0, stream=stream)

    class FakeTokens(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            logs["target_tokens"] = 100.0 * (batch + 1)  # 100 real tokens per batch

    _fit(model, 6, [FakeTokens(), progress], steps_per_epoch=3)
    lines = stream.getvalue().strip().splitlines()
    assert lines[-1].startswith("step 6/6 (100.0%)")
    assert "tok/s" in lines[-1] and "ETA" in lines[-1] and "lr " in lines[-1]
    assert progress.tokens_total == 600.0
    rows = json.loads((tmp_path / "history.json").read_text())["rows"]
    assert [r["step"] for r in rows] == [2, 4, 6]
    assert all(r["tokens_per_s"] > 0 and np.isfinite(r["loss"]) for r in rows)
    csv_header = (tmp_path / "history.csv").read_text().splitlines()[0].split(",")
    assert {"step", "loss", "learning_rate", "tokens_per_s"} <= set(csv_header)


# ---------------------------------------------------------------------------------------------
# The resumable backup: written crash-safely, repaired on start


def _backed_up(tmp_path, epochs: int = 2):
    """A backup after ``epochs`` epochs of 2 steps: latest = epoch ``epochs``, .bkp = one less."""
    backup = tmp_path / "backup"
    _fit(_dense_model(), 2 * epochs, [checkpoints.ResumableBackup(backup)], steps_per_epoch=2)
    return backup


def _epochs_run_on_resume(backup, epochs: int = 4) -> list[int]:
    ran = []
    counter = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: ran.append(e))
    _fit(_dense_model(), 2 * epochs, [checkpoints.ResumableBackup(backup, stream=io.StringIO()),
                                      counter], steps_per_epoch=2)
    return ran


def test_backup_states_are_whole_and_tagged_with_one_id(tmp_path):
    import h5py

    backup = _backed_up(tmp_path)
    assert checkpoints.check_state(backup) == (2, "")
    assert checkpoints.check_state(backup, ".bkp") == (1, "")
    assert checkpoints.restored_epoch(backup) == 2
    meta = json.loads((backup / "training_metadata.json").read_text())
    with h5py.File(backup / "latest.weights.h5") as f:
        assert f.attrs["aiayn_backup_id"] == meta["backup_id"]
    with np.load(backup / "extra_state.npz") as extra:
        assert str(extra["backup_id"]) == meta["backup_id"]
    assert not [p for p in backup.iterdir() if ".tmp" in p.name]
    assert _epochs_run_on_resume(backup) == [2, 3]


@pytest.mark.parametrize("damage", ["metadata_truncated", "weights_truncated",
                                    "weights_of_a_later_save", "extra_missing"])
def test_a_damaged_latest_state_falls_back_to_the_previous_one(tmp_path, damage):
    backup = _backed_up(tmp_path)
    meta, weights = backup / "training_metadata.json", backup / "latest.weights.h5"
    if damage == "metadata_truncated":  # Keras wrote it in place: a kill mid-write
        meta.write_text(meta.read_text()[:7])
    elif damage == "weights_truncated":
        weights.write_bytes(weights.read_bytes()[:300])
    elif damage == "weights_of_a_later_save":  # killed between the weights and the metadata
        weights.write_bytes((backup / "latest.weights.h5.bkp").read_bytes())
    else:
        (backup / "extra_state.npz").unlink()
    (backup / ".training_metadata.json.0123456789ab.tmp").write_text("{")  # a killed write
    epoch, why = checkpoints.check_state(backup)
    assert epoch is None and why
    assert checkpoints.restored_epoch(backup) == 1  # read-only: the previous state's epoch
    stream = io.StringIO()
    assert checkpoints.prepare_backup(backup, stream) == 1
    assert "resuming from the previous one (epoch 1)" in stream.getvalue()
    assert checkpoints.check_state(backup) == (1, "")  # the .bkp state copied over the latest
    assert not (backup / ".training_metadata.json.0123456789ab.tmp").exists()
    assert _epochs_run_on_resume(backup) == [1, 2, 3]


def test_a_backup_without_any_whole_state_is_discarded_with_a_note(tmp_path):
    backup = _backed_up(tmp_path)
    for name in ("training_metadata.json", "training_metadata.json.bkp"):
        (backup / name).write_text("{not json")
    stream = io.StringIO()
    assert checkpoints.prepare_backup(backup, stream) == 0
    assert "no usable state" in stream.getvalue() and "starts again from step 0" in \
        stream.getvalue()
    assert not backup.exists()
    assert _epochs_run_on_resume(backup, epochs=2) == [0, 1]


def test_a_backup_written_by_keras_itself_is_still_restored(tmp_path):
    backup = tmp_path / "backup"
    _fit(_dense_model(), 4, [keras.callbacks.BackupAndRestore(str(backup),
                                                              delete_checkpoint=False)],
         steps_per_epoch=2)
    assert checkpoints.check_state(backup) == (2, "")  # no ids: HDF5 and metadata checked
    assert _epochs_run_on_resume(backup) == [2, 3]


# ---------------------------------------------------------------------------------------------
# Divergence: the loss itself, and nothing saved after it


class _NanLossAt(keras.callbacks.Callback):
    """Makes the loss of batch ``at`` (0-based, over the run) non-finite: the dense kernel is NaN
    during that batch only (as a loss-scale optimizer would leave the weights: it skips the
    update), then restored."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.seen, self.saved = at, 0, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.seen == self.at:
            kernel = self.model.get_layer("dense").kernel
            self.saved = keras.ops.convert_to_numpy(kernel)
            kernel.assign(np.full_like(self.saved, np.nan))

    def on_train_batch_end(self, batch, logs=None):
        if self.seen == self.at:
            self.model.get_layer("dense").kernel.assign(self.saved)
        self.seen += 1


def test_divergence_guard_stops_on_a_nan_loss_and_blocks_every_writer(tmp_path):
    model = _dense_model()
    stream = io.StringIO()
    guard = cb.DivergenceGuard(stream)
    assert isinstance(guard, keras.callbacks.TerminateOnNaN)
    ckpts = checkpoints.StepCheckpoints(tmp_path / "ckpt", every=1, keep=10,
                                        skip_if=lambda: guard.diverged)
    backup = checkpoints.ResumableBackup(tmp_path / "backup", skip_if=lambda: guard.diverged)
    evaluator = DevEvaluator(lambda s: list(s), ["a b c d"], ["a b c d"], every=1,
                                best_path=tmp_path / "best.weights.h5", stream=io.StringIO(),
                                skip_if=lambda: guard.diverged)
    # Batch 5 (0-based) is the 2nd batch of the 2nd epoch: steps 1-5 are good.
    _fit(model, 12, [backup, guard, ckpts, evaluator, _NanLossAt(5)], steps_per_epoch=4)
    assert guard.diverged and guard.step == 6 and not np.isfinite(guard.loss)
    assert "non-finite loss" in stream.getvalue() and "at step 6" in stream.getvalue()
    assert [s for s, _ in artifacts.list_checkpoints(tmp_path / "ckpt")] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in evaluator.results] == [1, 2, 3, 4, 5]
    assert checkpoints.restored_epoch(tmp_path / "backup") == 1  # the cut epoch: no backup


def test_signal_stop_stops_at_the_next_batch_end():
    import signal

    model = _dense_model()
    stopper = cb.SignalStop()

    class SendAt(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 2:
                stopper.handle(signal.SIGTERM)

    _fit(model, 10, [SendAt(), stopper])
    assert stopper.received == "SIGTERM" and cb.current_step(model) == 3


def test_dev_loss_batches_are_the_featurised_pairs_in_order_of_length(toy_pairs, toy_tokenizer,
                                                                      monkeypatch):
    from aiayn.pipeline.training import dev_loss

    monkeypatch.setattr(dev_loss, "DEV_LOSS_BATCH", 3)
    pairs = toy_pairs[:12]
    batches = dev_loss.dev_batches(pairs, toy_tokenizer, 128, toy_tokenizer.pad_id)
    rows = [row[row != toy_tokenizer.pad_id].tolist()
            for _, labels in batches for row in labels.numpy()]
    by_length = sorted(pairs, key=lambda pair: len(pair[0]) + len(pair[1]))
    # Each pair once, shortest first; the labels are the target's ids and EOS, as training's.
    assert rows == [toy_tokenizer.tokenize([t]).to_list()[0] + [toy_tokenizer.eos_id]
                    for _, t in by_length]
    assert [b[1].shape[0] for b in batches] == [3, 3, 3, 3]
    widths = [int(b[1].shape[1]) for b in batches]
    unsorted = [max(len(toy_tokenizer.tokenize([t]).to_list()[0]) + 1 for _, t in group)
                for group in (pairs[i:i + 3] for i in range(0, 12, 3))]
    assert sum(widths) <= sum(unsorted)
