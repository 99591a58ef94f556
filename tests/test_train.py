"""Training: the paper's recipe wired from the config, and a tiny end-to-end run."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from aiayn.pipeline.config import load_config  # noqa: E402
from aiayn.pipeline.training import artifacts, averaging, recipe  # noqa: E402
from aiayn.pipeline.training import callbacks as cb  # noqa: E402
from aiayn.pipeline.training import train as train_lib  # noqa: E402


def _paper_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    step = step + 1  # the schedule counts optimizer iteration 0 as step 1
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def test_optimizer_is_the_papers_adam_on_the_warmup_schedule():
    cfg = load_config(["tiny"], ["model.hidden_dim=64", "train.warmup_steps=100",
                                 "train.learning_rate_scale=2.0"])
    opt = recipe.make_optimizer(cfg)
    assert (opt.beta_1, opt.beta_2, opt.epsilon) == (0.9, 0.98, 1e-9)
    assert opt.gradient_accumulation_steps is None
    for step in (0, 49, 99, 399, 9999):
        np.testing.assert_allclose(float(opt._learning_rate(step)),
                                   _paper_lr(step, 64, 100, 2.0), rtol=1e-5)


def test_gradient_accumulation_feeds_the_schedule_update_steps():
    cfg = load_config(["tiny"], ["model.hidden_dim=64", "train.warmup_steps=100",
                                 "train.gradient_accumulation_steps=4"])
    opt = recipe.make_optimizer(cfg)
    assert opt.gradient_accumulation_steps == 4
    # Keras passes the micro-batch counter; the schedule must see micro_batches // 4.
    for micro_batches in (0, 3, 4, 401, 4000):
        np.testing.assert_allclose(float(opt._learning_rate(micro_batches)),
                                   _paper_lr(micro_batches // 4, 64, 100), rtol=1e-5)
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(opt._learning_rate))
    assert restored.accumulation_steps == 4


def test_compiled_loss_is_label_smoothed_and_ignores_padding():
    cfg = load_config(["tiny"], ["train.label_smoothing=0.2"])
    loss, metrics = recipe.make_loss_and_metrics(cfg, pad_id=3)
    logits = np.random.default_rng(1).normal(size=(2, 4, 6)).astype("float32")
    labels = np.array([[1, 2, 3, 3], [5, 3, 3, 3]])  # 3 = pad
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    per_token = 0.8 * nll + 0.2 * -logp.mean(-1)
    np.testing.assert_allclose(float(loss(labels, logits)), per_token[labels != 3].mean(),
                               rtol=1e-5)
    tokens = [m for m in metrics if isinstance(m, cb.TargetTokens)][0]
    tokens.update_state(labels, logits)
    assert float(tokens.result()) == 3.0


# ---------------------------------------------------------------------------------------------
# A tiny end-to-end run (shared by the tests below; ~20 s on 2 cores)


@pytest.fixture(scope="module")
def tiny_run(toy_config, spm_model_path, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tiny_run")
    cfg = load_config(["tiny"], [f"data.data_dir={toy_config.data.data_dir}",
                                 "data.vocab_size=200", f"train.run_dir={run_dir}",
                                 "train.steps=20", "train.steps_per_epoch=5",
                                 "train.checkpoint_every=5", "train.keep_checkpoints=3",
                                 "train.average_last=3", "train.eval_every=10",
                                 "train.eval_max_sentences=8", "train.dev_loss_every=5",
                                 "train.lr_schedule=budget", "train.warmup_steps=5"])
    summary = train_lib.train(cfg)
    return cfg, summary


def test_training_gives_back_the_callers_global_dtype_policy(toy_config, spm_model_path,
                                                            tmp_path, monkeypatch):
    """Training sets the global policy (mixed_bfloat16 on a CPU with bf16 units); a model the
    caller builds afterwards must not inherit it (it did, and broke later float32 checks)."""
    cfg = load_config(["tiny"], [f"data.data_dir={toy_config.data.data_dir}",
                                 "data.vocab_size=200", f"train.run_dir={tmp_path / 'run'}",
                                 "train.steps=2", "train.steps_per_epoch=2",
                                 "train.checkpoint_every=2", "train.eval_every=0",
                                 "train.dev_loss_every=0", "train.mixed_precision=mixed_bfloat16"])
    seen = []

    class Policy(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(keras.mixed_precision.global_policy().name)

    scored_in = []

    def select(cfg, model, *args, **kwargs):
        scored_in.append(model.compute_dtype)
        return averaging.select_final_weights(cfg, model, *args, **kwargs)

    monkeypatch.setattr(train_lib, "select_final_weights", select)
    assert keras.mixed_precision.global_policy().name == "float32"
    summary = train_lib.train(cfg, extra_callbacks=[Policy()])
    assert summary["mixed_precision"] == "mixed_bfloat16" and seen == ["mixed_bfloat16"] * 2
    # The final weights are chosen as they are served: in float32, not the training policy.
    assert scored_in == ["float32"]
    assert keras.mixed_precision.global_policy().name == "float32"


def test_tiny_run_trains_and_writes_the_run_directory(tiny_run):
    cfg, summary = tiny_run
    run_dir = tiny_run[0].train.run_dir
    from pathlib import Path

    run_dir = Path(run_dir)
    assert summary["steps"] == 20 and summary["stop_reason"] == "steps"
    assert summary["end_state"] == "complete"
    assert summary["time_budget_seconds"] == 0.0
    state = json.loads((run_dir / "train_state.json").read_text())
    assert state["status"] == "complete" and state["summary"]["end_state"] == "complete"
    assert (run_dir / "train.lock").read_text() == "", "the lock is released, naming nobody"
    assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name]
    assert summary["tokens_per_second"] > 0
    for name in ("config.yaml", "history.json", "history.csv", "averaging.json",
                 "final.weights.h5", "best.weights.h5", "train_state.json"):
        assert (run_dir / name).exists(), name
    assert not list(run_dir.glob("backup*")), "the backup is removed once the run is complete"
    assert [s for s, _ in artifacts.list_checkpoints(run_dir / "checkpoints")] == [10, 15, 20]
    rows = json.loads((run_dir / "history.json").read_text())["rows"]
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps) and steps[-1] == 20
    logged = [r for r in rows if "loss" in r]
    assert all(np.isfinite(r["loss"]) for r in logged)
    rates = [r["learning_rate"] for r in logged]
    # lr_schedule=budget: a 5-step warm-up, then linear decay to 0 at the 20-step budget.
    peak = rates.index(max(rates))
    assert rates[peak] > 0 and rates[-1] == 0.0
    assert rates[peak:] == sorted(rates[peak:], reverse=True)
    dev_losses = [(r["step"], r["dev_loss"]) for r in rows if "dev_loss" in r]
    assert [s for s, _ in dev_losses] == [5, 10, 15, 20]
    assert all(np.isfinite(v) and v > 0 for _, v in dev_losses)
    assert logged[0]["loss"] > logged[-1]["loss"], "the loss goes down"
    assert [r["step"] for r in rows if "dev_bleu" in r] == [10, 20]
    from aiayn.pipeline.config import read_config

    assert read_config(run_dir / "config.yaml") == cfg


def test_tiny_run_chooses_final_weights_between_last_and_average(tiny_run):
    cfg, summary = tiny_run
    from pathlib import Path

    run_dir = Path(cfg.train.run_dir)
    report = json.loads((run_dir / "averaging.json").read_text())
    assert {"last", "average_last_3"} <= set(report["candidates"])
    for entry in report["candidates"].values():
        assert "bleu" in entry and "chrf" in entry and entry["bleu_signature"]
    chosen = report["chosen"]
    assert chosen in report["candidates"]
    assert summary["dev_bleu"] == report["candidates"][chosen]["bleu"]
    # final.weights.h5 holds exactly the chosen candidate.
    from aiayn.pipeline.training.artifacts import build_model, load_tokenizer

    tokenizer = load_tokenizer(cfg)
    final, chosen_model = build_model(cfg, tokenizer), build_model(cfg, tokenizer)
    artifacts.load_model_weights(final, run_dir / "final.weights.h5")
    averaging.average_weight_files(chosen_model, report["candidates"][chosen]["files"])
    for a, b in zip(final.weights, chosen_model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_choice_of_the_final_weights_is_their_dev_evaluation(tiny_run):
    """Chosen on the whole dev split, the kept candidate's translations are the final weights'
    eval/dev.json and dev.hyp.txt, as `aiayn evaluate --split dev` writes them: `make train`
    takes them instead of translating the split again."""
    from pathlib import Path

    from aiayn.pipeline.evaluation.evaluate import evaluate_run

    cfg, summary = tiny_run
    run_dir = Path(cfg.train.run_dir)
    written = summary["dev_evaluation"]
    chosen = summary["averaging"]["candidates"][summary["averaging"]["chosen"]]
    assert (written["bleu"], written["chrf"]) == (chosen["bleu"], chosen["chrf"])
    assert written["sentences"] == len(artifacts.read_split(cfg, "dev"))
    # This job's only: a later job cannot know that the final weights are still these.
    assert "dev_evaluation" not in json.loads((run_dir / "train_state.json").read_text())[
        "summary"]
    assert "dev_evaluation" not in json.loads((run_dir / "averaging.json").read_text())
    saved = json.loads((run_dir / "eval" / "dev.json").read_text())
    hyps = (run_dir / "eval" / "dev.hyp.txt").read_text(encoding="utf-8")
    assert len(hyps.splitlines()) == written["sentences"]
    fresh = evaluate_run(cfg, split="dev")
    assert (run_dir / "eval" / "dev.hyp.txt").read_text(encoding="utf-8") == hyps
    for key in ("split", "sentences", "bleu", "chrf", "bleu_signature", "chrf_signature",
                "bleu_detail", "length_by_reference", "metric_settings", "weights", "decode",
                "samples", "hypotheses_path"):
        assert saved[key] == fresh[key] == written[key], key


@pytest.mark.parametrize("margin, scores, chosen", [
    (0.0, (20.0, 20.3, 20.2), "average_last_3"),  # the highest score wins
    (0.5, (20.0, 20.3, 20.45), "last"),  # within the margin: the last checkpoint stays
    (0.5, (20.0, 20.6, 20.2), "average_last_3"),
    (0.5, (20.0, 20.6, 20.9), "best_dev_step_10"),
    (0.5, (20.0, 19.0, 18.0), "last"),
])
def test_another_candidate_replaces_the_last_weights_only_beyond_the_selection_margin(
        tiny_run, tmp_path, monkeypatch, margin, scores, chosen):
    import shutil
    from pathlib import Path

    cfg, _ = tiny_run
    run_dir = tmp_path / "run"
    shutil.copytree(cfg.train.run_dir, run_dir)
    (run_dir / "dev_eval_state.json").write_text(json.dumps({"best_step": 10}))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, run_dir=str(run_dir), selection_margin=margin))
    bleus = iter(scores)
    monkeypatch.setattr(averaging, "_score_on_dev",
                        lambda *args: ({"bleu": next(bleus), "chrf": 40.0, "seconds": 1.0},
                                       ["b"]))
    tokenizer = artifacts.load_tokenizer(cfg)
    report = averaging.select_final_weights(cfg, artifacts.build_model(cfg, tokenizer), tokenizer,
                                            pairs=[("a", "b")])
    assert list(report["candidates"]) == ["last", "average_last_3", "best_dev_step_10"]
    assert report["chosen"] == chosen and report["selection_margin"] == margin
    assert json.loads((Path(run_dir) / "averaging.json").read_text())["chosen"] == chosen


def test_the_moving_average_of_the_weights_is_a_candidate_at_the_last_step(
        toy_config, spm_model_path, tmp_path):
    """`train.ema_momentum`: the run keeps its trained weights (the last checkpoint), writes the
    average of the last step beside them, and the choice of the final weights scores it."""
    from aiayn.pipeline.training.artifacts import RunFiles, build_model, load_tokenizer

    momentum = 0.5
    cfg = load_config(["tiny"], [f"data.data_dir={toy_config.data.data_dir}",
                                 "data.vocab_size=200", f"train.run_dir={tmp_path / 'run'}",
                                 "train.steps=10", "train.steps_per_epoch=5",
                                 "train.checkpoint_every=5", "train.keep_checkpoints=2",
                                 "train.average_last=2", "train.eval_every=0",
                                 "train.dev_loss_every=0", f"train.ema_momentum={momentum}"])
    trained = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            trained.append([v.numpy() for v in self.model.trainable_variables])

    summary = train_lib.train(cfg, extra_callbacks=[Record()])
    assert summary["steps"] == len(trained) == 10
    expected = trained[0]
    for weights in trained[1:]:
        expected = [momentum * e + (1 - momentum) * w for e, w in zip(expected, weights)]
    files = RunFiles.of(cfg)
    assert sorted(p.name for p in files.checkpoints.glob("ema-*")) == ["ema-00000010.weights.h5"]
    tokenizer = load_tokenizer(cfg)
    for path, want in ((files.ema(10), expected), (files.checkpoint(10), trained[-1])):
        model = build_model(cfg, tokenizer)
        artifacts.load_model_weights(model, path)
        for variable, value in zip(model.trainable_variables, want):
            np.testing.assert_allclose(variable.numpy(), value, rtol=1e-5, atol=1e-7)
    assert list(summary["averaging"]["candidates"]) == ["last", "average_last_2", "ema"]
    assert averaging.candidate_count(cfg) == 4
    # An average of another step than the last checkpoint's is not a candidate.
    files.ema(10).rename(files.ema(5))
    assert [name for name, _ in averaging._candidates(cfg, files)[1]] == [
        "last", "average_last_2"]


def test_rerunning_a_finished_run_returns_its_summary_without_training(tiny_run, capsys):
    cfg, summary = tiny_run
    recorded = {k: v for k, v in summary.items() if k != "dev_evaluation"}
    assert train_lib.train(cfg) == json.loads(json.dumps(recorded))
    assert "already holds a finished run" in capsys.readouterr().out


def test_average_command_and_evaluate_on_the_tiny_run(tiny_run):
    cfg, _ = tiny_run
    from pathlib import Path

    from aiayn.pipeline.evaluation.evaluate import evaluate_run

    # The candidates are scored on every dev pair (train.selection_max_sentences: 0), not on
    # the 8 of the dev evaluations during training...
    dev_pairs = artifacts.read_split(cfg, "dev")
    assert len(dev_pairs) > cfg.train.eval_max_sentences
    assert tiny_run[1]["averaging"]["dev_sentences"] == len(dev_pairs)
    # ... or on as many as train.selection_max_sentences asks for.
    report = averaging.average_checkpoints_for_run(dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, selection_max_sentences=5)))
    assert report["dev_sentences"] == 5 and report["chosen"] in report["candidates"]
    assert [s for s, _ in averaging.selection_pairs(dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, selection_max_sentences=5)))] == \
        [dev_pairs[i * len(dev_pairs) // 5][0] for i in range(5)]
    result = evaluate_run(cfg, split="test")
    run_dir = Path(cfg.train.run_dir)
    hyps = (run_dir / "eval" / "test.hyp.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == result["sentences"] == 29
    saved = json.loads((run_dir / "eval" / "test.json").read_text())
    assert saved["bleu"] == result["bleu"] and saved["bleu_signature"].startswith("nrefs:1")
    assert len(saved["samples"]) == 3 and {"source", "reference", "hypothesis"} <= \
        set(saved["samples"][0])
    assert saved["decode"] == dataclasses.asdict(cfg.decode)


def test_a_second_train_on_a_run_directory_in_use_is_refused_naming_the_holder(tiny_run,
                                                                              capsys):
    import os
    import signal
    import subprocess
    import sys

    from aiayn.pipeline import cli
    from aiayn.pipeline.fileio import LockHeld

    cfg, _ = tiny_run
    lock = f"{cfg.train.run_dir}/train.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from aiayn.pipeline.fileio import hold_lock\n"
         f"with hold_lock({lock!r}, 'x'):\n    print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld, match=f"in use by pid {holder.pid} on host"):
            train_lib.train(cfg)
        code = cli.main(["train", "--preset", "tiny",
                         "--set", f"train.run_dir={cfg.train.run_dir}"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and f"pid {holder.pid}" in err
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    # The holder died: its lock is taken over (the finished run's summary comes back).
    assert train_lib.train(cfg)["end_state"] == "complete"
    assert "taking over the lock of pid" in capsys.readouterr().out


def _session_that_ended(diverged=False, signal_name=None, early=False, budget=None):
    session = object.__new__(train_lib._Session)
    session.guard = cb.DivergenceGuard()
    session.guard.step = 7 if diverged else None
    session.stopper = cb.SignalStop()
    session.stopper.received = signal_name
    session.evaluator = type("E", (), {"stopped_early": early})()
    session.budget = cb.Budget(10)
    session.budget.reason = budget
    return session


@pytest.mark.parametrize("ended, expected", [
    ({"budget": "steps"}, ("complete", "steps")),
    ({}, ("complete", "steps")),  # fit ran all its batches
    ({"early": True}, ("complete", "early_stopping")),
    ({"budget": "time"}, ("time_budget", "time")),
    ({"diverged": True, "budget": "steps"}, ("diverged", "nan")),
    ({"signal_name": "SIGTERM"}, ("interrupted", "interrupted")),
    ({"signal_name": "SIGTERM", "budget": "steps"}, ("complete", "steps")),  # it had finished
    ({"signal_name": "SIGINT", "budget": "steps"}, ("interrupted", "interrupted")),
    ({"signal_name": "SIGTERM", "diverged": True}, ("diverged", "nan")),
])
def test_end_state_mapping(ended, expected):
    assert _session_that_ended(**ended).end_state() == expected


def test_a_rerun_returns_finished_runs_refuses_diverged_ones_and_resumes_the_rest(tmp_path):
    import io

    from aiayn.pipeline.errors import UserInputError

    files = artifacts.RunFiles(tmp_path)
    assert train_lib._previous_end(files, io.StringIO()) is None
    summary = {"steps": 12, "end_state": "time_budget", "stop_reason": "time"}
    files.train_state.write_text(json.dumps({"status": "time_budget", "summary": summary}))
    files.final.write_bytes(b"weights")
    stream = io.StringIO()
    assert train_lib._previous_end(files, stream) == summary
    assert "already holds a finished run (12 steps, time_budget)" in stream.getvalue()
    files.train_state.write_text(json.dumps({"status": "interrupted", "summary": {}}))
    assert train_lib._previous_end(files, io.StringIO()) is None  # resume
    ckpt = str(files.checkpoint(4))
    files.train_state.write_text(json.dumps({"status": "diverged", "summary": {
        "diverged_at_step": 6, "last_good_checkpoint": ckpt, "last_good_step": 4,
        "resume_from_step": 3}}))
    with pytest.raises(UserInputError) as err:
        train_lib._previous_end(files, io.StringIO())
    message = str(err.value)
    assert "diverged (non-finite loss at step 6)" in message and ckpt in message
    assert "train.learning_rate_scale" in message and "fresh train.run_dir" in message
    assert f"delete {files.train_state}" in message and "\n" not in message


@pytest.mark.slow
def test_a_run_with_the_target_output_vocabulary_trains_exports_and_never_leaves_it(
        toy_config, spm_model_path, tmp_path):
    from aiayn.pipeline.data.vocab import output_ids
    from aiayn.pipeline.release.export_run import export_run

    cfg = load_config(["tiny"], [f"data.data_dir={toy_config.data.data_dir}",
                                 "data.vocab_size=200", "data.output_vocabulary=target",
                                 f"train.run_dir={tmp_path / 'run'}", "train.steps=10",
                                 "train.steps_per_epoch=5", "train.checkpoint_every=5",
                                 "train.keep_checkpoints=2", "train.average_last=2",
                                 "train.eval_every=10", "train.eval_max_sentences=4",
                                 "train.dev_loss_every=5", "decode.beam_size=2",
                                 f"export.base_dir={tmp_path / 'exports'}"])
    ids = output_ids(cfg)
    tokenizer = artifacts.load_tokenizer(cfg)
    assert 4 < len(ids) < tokenizer.vocabulary_size
    summary = train_lib.train(cfg)
    assert summary["end_state"] == "complete" and summary["steps"] == 10
    rows = json.loads((tmp_path / "run" / "history.json").read_text())["rows"]
    assert [r["step"] for r in rows if np.isfinite(r.get("dev_loss", np.nan))] == [5, 10]
    model = artifacts.build_model(cfg, tokenizer, dtype="float32")
    assert model.output_ids == tuple(ids)
    artifacts.load_model_weights(model, tmp_path / "run" / "final.weights.h5")
    import tensorflow as tf

    features = tokenizer.featurize_source(
        tf.constant([s for s, _ in artifacts.read_split(cfg, "test")]), limit=24)
    out = model.generate(features.token_ids, features.padding_mask, tokenizer.bos_id,
                         tokenizer.eos_id, beam_size=2, max_extra_length=6)
    produced = set(np.unique(keras.ops.convert_to_numpy(out["token_ids"])).tolist())
    assert produced <= set(ids)
    # The export is verified against in-process translation in a fresh process (stock ops).
    assert (export_run(cfg) / "saved_model.pb").is_file()
