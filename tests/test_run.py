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
