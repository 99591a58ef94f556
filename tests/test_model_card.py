"""The model card (aiayn.pipeline.release.model_card) and its place in every export."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from aiayn.pipeline.errors import UserInputError

HYPOTHESES = ["Y la tierra estaba desordenada.", "Te amo.", "La paz sea con vosotros."]
REFERENCES = ["Y la tierra estaba desordenada y vacía.", "Te amo.", "La paz sea con vosotros."]


@pytest.fixture()
def run_cfg(toy_config, tmp_path):
    """The tiny preset with its own data and run directories (no shared state between tests)."""
    data_dir, run_dir = tmp_path / "data", tmp_path / "run"
    data_dir.mkdir()
    (run_dir / "eval").mkdir(parents=True)
    return dataclasses.replace(
        toy_config, data=dataclasses.replace(toy_config.data, data_dir=str(data_dir)),
        train=dataclasses.replace(toy_config.train, run_dir=str(run_dir)),
        export=dataclasses.replace(toy_config.export, base_dir=str(tmp_path / "exports")))


def _eval_report(split):
    """A report as `aiayn evaluate` writes it, with real sacreBLEU scores and signatures."""
    from aiayn.pipeline.training.validation import score

    return {"split": split, "sentences": len(HYPOTHESES), **score(HYPOTHESES, REFERENCES),
            "samples": [{"source": "s", "reference": "r", "hypothesis": "h"}]}


def _data_report():
    return {
        "stamp": "ff49fc1ccdf6b413",
        "source": {"corpus": "bible",
                   "description": "World English Bible (engWEB2015eb) -> Reina-Valera 1909 "
                                  "(spaRV1909eb), verse pairs read with mod2imp, split by whole "
                                  "books",
                   "packages": {"libsword-utils": "1.9.0+dfsg-4+b4", "sword-text-sparv": "2.60-1",
                                "sword-text-web": "426.0-1"},
                   "books": {"dev": ["Ruth", "Jonah"], "test": ["Esther", "John"],
                             "train": "every other book both modules have"}},
        "kept": 29682, "dropped": {"length_ratio": 3},
        "splits": {"train": {"pairs": 26780, "sha256": "8f5b12" + "0" * 58},
                   "dev": {"pairs": 916, "sha256": "293ede" + "1" * 58},
                   "test": {"pairs": 1986, "sha256": "0fe216" + "2" * 58}},
    }


def test_card_contains_the_evaluation_scores_and_signatures(run_cfg):
    from aiayn.pipeline.release.model_card import write_model_card

    run_dir = run_cfg.train.run_dir
    reports = {split: _eval_report(split) for split in ("dev", "test")}
    for split, report in reports.items():
        with open(f"{run_dir}/eval/{split}.json", "w") as f:
            json.dump(report, f)
    card = write_model_card(run_cfg)  # reads <run_dir>/eval/*.json itself
    bleu, chrf = reports["test"]["bleu"], reports["test"]["chrf"]
    assert f"| test | {bleu:.2f} | {chrf:.2f} | 3 |" in card
    assert f"| dev | {bleu:.2f} | {chrf:.2f} | 3 |" in card
    assert card.index("| dev |") < card.index("| test |")
    assert f"test bleu: {reports['test']['bleu_signature']}" in card
    assert f"test chrf: {reports['test']['chrf_signature']}" in card
    assert "nrefs:1" in reports["test"]["bleu_signature"]  # a real sacreBLEU signature
    # The same scores, passed in (as the export does), give the same section.
    assert write_model_card(run_cfg, eval_reports=reports) == card


def test_card_describes_data_model_training_decoding_and_limits(run_cfg, tmp_path):
    from aiayn.pipeline.release.model_card import write_model_card

    (tmp_path / "data" / "data_report.json").write_text(json.dumps(_data_report()))
    state = {"status": "complete", "summary": {
        "steps": 20, "stop_reason": "steps", "train_seconds": 3725.0,
        "time_budget_seconds": 2400.0,
        "tokens_per_second": 1234.5, "strategy": "OneDeviceStrategy", "replicas": 1,
        "mixed_precision": "float32", "jit_compile": False, "onednn": "on",
        "parameters": 12345,
        "averaging": {"chosen": "average_last_2", "selection_margin": 0.5,
                      "candidates": {"last": {}, "average_last_2": {}, "ema": {}}}}}
    (tmp_path / "run" / "train_state.json").write_text(json.dumps(state))
    out = tmp_path / "card" / "model_card.md"
    card = write_model_card(run_cfg, out, vocabulary_size=200)
    assert out.read_text(encoding="utf-8") == card
    for text in ("Reina-Valera 1909", "| train | 26780 | `8f5b12", "| dev | 916 |",
                 "| test | 1986 |", "`sword-text-sparv` 2.60-1", "`libsword-utils` 1.9.0+dfsg-4+b4",
                 "Pairs kept: 29682; dropped: length_ratio 3", "Esther, John",
                 "preset | `tiny`", "12,345", "layers N (encoder, decoder) | 2",
                 "| d_model | 16 |", "| heads h | 2 |", "vocabulary (joint) | 200",
                 "Steps: 20 of 20", "training time 1 h 02 min of a 40 min 00 s time budget",
                 "OneDeviceStrategy",
                 "XLA off, oneDNN on; host:",
                 "`average_last_2` (the best on dev among `last`, `average_last_2`, `ema`;",
                 "another than the last only when it beats the last by more than 0.5 BLEU",
                 f"beam size {run_cfg.decode.beam_size}",
                 f"length penalty alpha {run_cfg.decode.length_penalty}",
                 "Archaic target language", "Bible verses only", "Verse-level",
                 "Not evaluated yet"):
        assert text in card, text


def test_card_without_any_run_files_says_what_is_missing(run_cfg):
    from aiayn.pipeline.release.model_card import write_model_card

    cfg = dataclasses.replace(run_cfg, data=dataclasses.replace(run_cfg.data, corpus="tsv"))
    card = write_model_card(cfg)
    assert "No data report found" in card and "No finished training state" in card
    assert "Not evaluated yet" in card and "parameters | unknown" in card
    assert "Archaic" not in card and "**Domain.**" in card  # generic limits for a user corpus


def test_every_export_carries_its_card(run_cfg, toy_tokenizer, tmp_path):
    """`publish.write_card` is what `export_model` runs before verification and publication."""
    from aiayn.pipeline.release.export_run import write_card
    from aiayn.pipeline.release.model_card import read_export_card
    from aiayn.pipeline.training.artifacts import build_model

    model = build_model(run_cfg, toy_tokenizer)
    tmp_version = tmp_path / "exports" / "translate" / ".tmp-3-abcd1234"
    path = write_card(run_cfg, model, toy_tokenizer, tmp_version,
                      {"test": {k: v for k, v in _eval_report("test").items() if k != "samples"}})
    assert path == tmp_version / "assets.extra" / "model_card.md"
    card = path.read_text(encoding="utf-8")
    n_params = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert card.startswith("# Model card: `translate` version 3")
    assert f"{n_params:,}" in card and f"| test | {_eval_report('test')['bleu']:.2f} |" in card
    # Published: the temporary dir becomes version 3; the model dir reads its newest version.
    tmp_version.rename(tmp_version.parent / "3")
    (tmp_version.parent / "1" / "assets.extra").mkdir(parents=True)
    (tmp_version.parent / "1" / "assets.extra" / "model_card.md").write_text("old")
    assert read_export_card(tmp_version.parent) == card
    assert read_export_card(tmp_version.parent / "1") == "old"
    with pytest.raises(UserInputError, match="No model card"):
        read_export_card(tmp_path)


def test_cli_model_card(run_cfg, tmp_path, capsys, monkeypatch):
    from aiayn.pipeline.cli import main

    version = tmp_path / "exports" / "translate" / "4"
    (version / "assets.extra").mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    (version / "assets.extra" / "model_card.md").write_text("# Model card: `translate` v4\n")
    assert main(["model-card", "--export", str(version)]) == 0
    assert "# Model card: `translate` v4" in capsys.readouterr().out
    assert main(["model-card", "--export", str(tmp_path / "nowhere")]) == 2
    assert "No model card" in capsys.readouterr().err
    # No --export and no export yet: the card is built from the run directory.
    monkeypatch.chdir(tmp_path)
    assert main(["model-card", "--preset", "tiny", "--set", "export.base_dir=none",
                 "--set", f"train.run_dir={run_cfg.train.run_dir}"]) == 0
    assert "Not evaluated yet" in capsys.readouterr().out


@pytest.mark.parametrize("schedule, shape, expected", [
    ("rsqrt", "linear", "warmup 7 steps inverse square root after it (learning-rate scale"),
    ("budget", "linear", "warmup 7 steps or 0.1 of the budget, then linear decay to zero over "
                         "the last 0.3 of the budget"),
    ("rsqrt_cooldown", "linear", "warmup 7 steps inverse square root after it, times a linear "
                                 "decay to zero over the last 0.3 of the budget"),
    ("rsqrt_cooldown", "sqrt", "warmup 7 steps inverse square root after it, times a 1 - sqrt "
                               "decay to zero over the last 0.3 of the budget"),
])
def test_card_names_the_learning_rate_schedule(run_cfg, schedule, shape, expected):
    from aiayn.pipeline.release.model_card import write_model_card

    cfg = dataclasses.replace(run_cfg, train=dataclasses.replace(
        run_cfg.train, lr_schedule=schedule, warmup_steps=7, warmup_fraction=0.1,
        decay_fraction=0.3, decay_shape=shape))
    assert expected in write_model_card(cfg)


@pytest.mark.parametrize("alpha, nbest, expected", [
    (0.0, -1, None),
    (0.3, -1, "; subword regularisation: each training pair segmented anew at each epoch, "
              "sampled with alpha 0.3 among all segmentations (evaluation and the export use "
              "the one best)."),
    (0.1, 64, "sampled with alpha 0.1 among the 64 best segmentations"),
])
def test_card_says_whether_training_sampled_subwords(run_cfg, alpha, nbest, expected):
    from aiayn.pipeline.release.model_card import write_model_card

    cfg = dataclasses.replace(run_cfg, data=dataclasses.replace(
        run_cfg.data, subword_alpha=alpha, subword_nbest=nbest))
    card = write_model_card(cfg)
    if expected is None:
        assert "subword regularisation" not in card and "sampled with" not in card
    else:
        assert expected in card


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_card_says_whether_training_joined_pairs(run_cfg, fraction):
    from aiayn.pipeline.release.model_card import write_model_card

    cfg = dataclasses.replace(run_cfg, data=dataclasses.replace(
        run_cfg.data, concat_fraction=fraction))
    card = write_model_card(cfg)
    said = ("; data augmentation by concatenation: two consecutive training pairs joined into "
            "one with probability 0.5 (evaluation and the export translate one sentence at a "
            "time).")
    assert (said in card) == bool(fraction)
    assert ("concatenation" in card) == bool(fraction)


@pytest.mark.parametrize("depths, expected", [((2, 0), "| layers N (encoder, decoder) | 2 |"),
                                              ((2, 2), "| layers N (encoder, decoder) | 2 |"),
                                              ((3, 1), "| layers N (encoder, decoder) | 3, 1 |")])
def test_card_gives_each_stack_its_depth(run_cfg, depths, expected):
    from aiayn.pipeline.release.model_card import write_model_card

    cfg = dataclasses.replace(run_cfg, model=dataclasses.replace(
        run_cfg.model, num_layers=depths[0], num_decoder_layers=depths[1]))
    assert expected in write_model_card(cfg)


@pytest.mark.parametrize("activation, expected", [
    ("relu", "| feed-forward activation | ReLU (as the paper) |"),
    ("gelu", "| feed-forward activation | GELU |"),
    ("swiglu", "| feed-forward activation | SwiGLU (gated, Shazeer 2020; the inner layer 2 x d_ff "
               "wide) |")])
def test_card_names_the_feed_forward_activation(run_cfg, activation, expected):
    from aiayn.pipeline.release.model_card import write_model_card

    cfg = dataclasses.replace(run_cfg, model=dataclasses.replace(
        run_cfg.model, ffn_activation=activation))
    assert expected in write_model_card(cfg)


@pytest.mark.parametrize("rate, tokens, late, expected", [
    (0.2, 0.0, 0.0, "| dropout P_drop | 0.2 |"),
    (0.2, 0.0, 0.25, "| dropout P_drop | 0.2 (from 0.25 of the run; none before) |"),
    (0.0, 0.0, 0.25, "| dropout P_drop | 0 |"),
    (0.2, 0.1, 0.0, "| dropout P_drop | 0.2; tokens 0.1 |"),
    (0.0, 0.1, 0.25, "| dropout P_drop | 0; tokens 0.1 (from 0.25 of the run; none before) |")])
def test_card_says_when_dropout_started(run_cfg, rate, tokens, late, expected):
    from aiayn.pipeline.release.model_card import write_model_card

    cfg = dataclasses.replace(
        run_cfg, model=dataclasses.replace(run_cfg.model, dropout=rate, token_dropout=tokens),
        train=dataclasses.replace(run_cfg.train, late_dropout=late))
    assert expected in write_model_card(cfg)


def test_card_names_the_output_vocabulary_and_its_size(run_cfg):
    from aiayn.pipeline.release.model_card import write_model_card

    assert "output vocabulary" not in write_model_card(run_cfg)  # joint: the paper's
    cfg = dataclasses.replace(run_cfg, data=dataclasses.replace(run_cfg.data,
                                                                output_vocabulary="target"))
    row = "| output vocabulary | the {}pieces of the training targets and the specials "
    assert row.format("") in write_model_card(cfg)  # not built yet: no count
    (Path(cfg.data.data_dir) / "output_ids.json").write_text(
        json.dumps({"output_pieces": 5213, "ids": []}), encoding="utf-8")
    assert row.format("5,213 ") in write_model_card(cfg)


@pytest.mark.parametrize("deadline, budget, expected", [
    (43.5, 2400.0, " of a 40 min 00 s time budget (what the job's 43.5-minute deadline left)"),
    (0.0, 2220.0, " of a 37 min 00 s time budget (train.max_minutes)"),
    (43.5, 0.0, ""),
])
def test_card_names_the_time_budget_and_what_set_it(run_cfg, deadline, budget, expected):
    from aiayn.pipeline.release.model_card import _budget_text

    train_cfg = dataclasses.replace(run_cfg.train, deadline_minutes=deadline)
    assert _budget_text(train_cfg, {"time_budget_seconds": budget}) == expected
