"""The training input builder records the length filter's counts (no training here)."""

from __future__ import annotations

import io
import json
import shutil

import pytest
import tensorflow as tf

from aiayn.pipeline.config import load_config
from aiayn.pipeline.errors import UserInputError


@pytest.fixture
def data_dir(tmp_path, spm_model_path):
    """A copy of the toy data dir (splits, spm.model) with a data report written before it."""
    out = tmp_path / "data"
    shutil.copytree(spm_model_path.parent, out)
    (out / "data_report.json").write_text(json.dumps({"stamp": "abc", "kept": 29}),
                                          encoding="utf-8")
    return out


def _make_input(cfg, tokenizer):
    from aiayn.pipeline.training.train import make_input

    stream = io.StringIO()
    try:
        return make_input(cfg, tokenizer, tf.distribute.get_strategy(), 0, stream=stream), stream
    except UserInputError as err:
        return err, stream


def test_make_input_prints_and_records_the_length_filter(data_dir, toy_tokenizer, toy_pairs):
    cfg = load_config(["tiny"], [f"data.data_dir={data_dir}", "data.vocab_size=200"])
    dataset, stream = _make_input(cfg, toy_tokenizer)
    assert isinstance(dataset, tf.data.Dataset)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("training length filter (data.max_length=32)")
    report = json.loads((data_dir / "data_report.json").read_text(encoding="utf-8"))
    assert report["stamp"] == "abc" and report["kept"] == 29  # the data stage's keys are kept
    counts = report["training_length_filter"]
    assert counts["pairs"] == len(toy_pairs)
    assert counts["kept"] + counts["dropped_too_long"] + counts["dropped_empty"] == len(toy_pairs)
    assert f"kept {counts['kept']} of {len(toy_pairs)} pairs" in lines[0]
    assert counts["file"] == str(data_dir / "train.tsv") and counts["max_length"] == 32
    assert not list(data_dir.glob(".*.tmp"))


def test_make_input_fails_at_once_when_no_pair_fits(data_dir, toy_tokenizer, toy_pairs):
    long = " ".join(s for s, _ in toy_pairs[:4])
    (data_dir / "train.tsv").write_text(f"{long}\t{long}\n" * 3, encoding="utf-8")
    cfg = load_config(["tiny"], [f"data.data_dir={data_dir}", "data.vocab_size=200"])
    err, stream = _make_input(cfg, toy_tokenizer)
    assert isinstance(err, UserInputError), err
    assert "No training pair fits data.max_length=32: all 3 pairs" in str(err)
    report = json.loads((data_dir / "data_report.json").read_text(encoding="utf-8"))
    assert report["training_length_filter"]["kept"] == 0  # recorded, so the report says why
    assert "kept 0 of" in stream.getvalue()
