"""`aiayn run` / `make train` orchestration: stage parsing, outputs, summary, CLI errors."""

import json

import pytest

from aiayn.pipeline import cli
from aiayn.pipeline.config import load_config
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.run import run_all


def test_unknown_stage_names_the_valid_ones():
    cfg = load_config(["tiny"])
    with pytest.raises(UserInputError, match=r"Unknown stage\(s\) \['trian'\].*data, vocab, "
                                             r"train, evaluate, export"):
        run_all(cfg, stages="data,trian")


def test_data_and_vocab_stages_on_a_user_corpus(tmp_path, toy_pairs):
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in toy_pairs * 3), encoding="utf-8")
    cfg = load_config(["tiny"], [f"data.corpus={corpus}", f"data.data_dir={tmp_path / 'data'}",
                                 "data.heldout_size=4", "data.vocab_size=200",
                                 f"train.run_dir={tmp_path / 'run'}"])
    result = run_all(cfg, stages="data,vocab")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert result == {"summary": str(tmp_path / "run" / "summary.json")}
    assert summary["stages"] == ["data", "vocab"]
    assert set(summary["stage_seconds"]) == {"data", "vocab"}
    assert summary["vocab"].endswith("spm.model")
    for split in ("train", "dev", "test"):
        assert (tmp_path / "data" / f"{split}.tsv").stat().st_size > 0
    assert (tmp_path / "run" / "config.yaml").exists()


def test_cli_reports_user_errors_without_traceback(tmp_path, capsys):
    missing = tmp_path / "nope.tsv"
    code = cli.main(["data", "--preset", "tiny", "--set", f"data.corpus={missing}",
                     "--set", f"data.data_dir={tmp_path / 'd'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "aiayn data: error:" in err and "nope.tsv" in err and "Traceback" not in err


def test_cli_rejects_unknown_config_keys(capsys):
    assert cli.main(["vocab", "--preset", "tiny", "--set", "data.vocab=3"]) == 2
    assert "unknown key data.vocab. Valid keys of 'data'" in capsys.readouterr().err


def test_help_lists_every_stage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("data", "vocab", "train", "evaluate", "export", "run", "serve", "translate",
                    "verify"):
        assert command in out


@pytest.mark.parametrize("value", ["soon", "nan", "inf", "99999999999"])
def test_run_refuses_a_start_time_that_is_not_one(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--preset", "tiny", "--started-at", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (f"argument --started-at: {value!r} is not a start time: give seconds since the "
            "epoch, as `date +%s` prints them, no later than now.") in err
    assert "Traceback" not in err


def test_the_job_time_counts_from_the_given_start(tmp_path, toy_pairs):
    import time

    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in toy_pairs * 3), encoding="utf-8")
    cfg = load_config(["tiny"], [f"data.corpus={corpus}", f"data.data_dir={tmp_path / 'data'}",
                                 "data.heldout_size=4", f"train.run_dir={tmp_path / 'run'}"])
    run_all(cfg, stages="data", started_at=time.time() - 120.0)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["job_seconds"] >= 120.0 > summary["wall_seconds"]


def test_the_evaluate_stage_takes_the_dev_evaluation_the_train_stage_wrote(tmp_path, monkeypatch,
                                                                          capsys):
    """The train stage's choice of the final weights translated the whole dev split with them:
    the evaluate stage translates only the test split then, and both again without it."""
    from aiayn.pipeline import run as run_lib
    from aiayn.pipeline.evaluation import evaluate as evaluate_lib
    from aiayn.pipeline.training import train as train_lib

    dev = {"split": "dev", "sentences": 3, "bleu": 12.34, "chrf": 40.0, "seconds": 2.0,
           "bleu_signature": "nrefs:1|tok:13a", "chrf_signature": "nrefs:1|nc:6",
           "metric_settings": "BLEU tokenizer `13a`"}
    translated = []
    monkeypatch.setattr(evaluate_lib, "evaluate_run", lambda cfg, split="dev", **kwargs: (
        translated.append(split) or {"split": split, "bleu": 1.0, "chrf": 2.0}))
    monkeypatch.setattr(run_lib, "_plot_curves", lambda run_dir: None)
    monkeypatch.setattr(train_lib, "train", lambda cfg, started_at=None: {
        "steps": 1, "dev_evaluation": dict(dev)})
    cfg = load_config(["tiny"], [f"train.run_dir={tmp_path / 'run'}"])
    run_all(cfg, stages="train,evaluate")
    assert translated == ["test"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dev"] == dev and "dev_evaluation" not in summary["train"]
    out = capsys.readouterr().out
    assert "dev: BLEU 12.34 chrF 40.00 on 3 sentences (2s)" in out
    assert "from the train stage's choice of them" in out

    # A finished run's stored summary (or a choice on fewer dev pairs) has none: dev again.
    monkeypatch.setattr(train_lib, "train", lambda cfg, started_at=None: {"steps": 1})
    translated.clear()
    run_all(cfg, stages="train,evaluate")
    assert translated == ["dev", "test"]
