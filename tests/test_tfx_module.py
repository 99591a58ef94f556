"""The TFX Trainer's run_fn and the ExampleGen input converter, WITHOUT TFX installed.

run_fn gets an object carrying the FnArgs fields it reads, over TFRecord files laid out as
ExampleGen writes them (``Split-train/data_tfrecord-00000-of-00001.gz``), and must leave the
same serving SavedModel as `make train` in ``serving_model_dir``, one that the verifier (what
the pipeline's InfraCheck runs) accepts.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from aiayn.pipeline.config import ConfigError, load_config
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.tfx.trainer import config_from_custom_config

SPLIT_FILE = "data_tfrecord-00000-of-00001.gz"  # ExampleGen's output file name


def _example_gen_output(root: Path, pairs_by_split: dict) -> Path:
    from aiayn.pipeline.tfx.examples import write_tfrecord

    for split, pairs in pairs_by_split.items():
        write_tfrecord(root / f"Split-{split}" / SPLIT_FILE, pairs)
    return root


def test_custom_config_round_trips_the_resolved_config():
    cfg = load_config(["tiny"], ["train.steps=7", "decode.beam_size=1", "decode.n_best=1"])
    custom = {"config": json.loads(json.dumps(cfg.to_dict())), "preset": cfg.preset,
              "overrides": ["model.dropout=0.2"]}
    got = config_from_custom_config(custom, train_steps=3)
    assert got.train.steps == 3, "TrainArgs.num_steps wins over the config"
    assert got.model.dropout == 0.2
    assert got.data == cfg.data and got.decode == cfg.decode and got.preset == "tiny"
    assert config_from_custom_config({"config": cfg.to_dict()}).train.steps == 7


def test_custom_config_errors_name_the_problem():
    with pytest.raises(UserInputError, match="unknown keys \\['steps'\\]"):
        config_from_custom_config({"steps": 3})
    with pytest.raises(ConfigError, match="unknown key train.stepz"):
        config_from_custom_config({"overrides": ["train.stepz=3"]})


def test_tfx_data_writes_example_gen_input(tmp_path, toy_pairs):
    import tensorflow as tf

    from aiayn.pipeline.data.readers import read_tfrecord
    from aiayn.pipeline.tfx.examples import INPUT_SPLITS, write_example_gen_input

    tsv = tmp_path / "corpus.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in toy_pairs), encoding="utf-8")
    cfg = load_config(["tiny"], [f"data.corpus={tsv}", "data.heldout_size=3",
                                 f"data.data_dir={tmp_path / 'data'}"])
    report = write_example_gen_input(cfg)
    out = Path(report["examples_dir"])
    assert out == tmp_path / "data" / "tfx_examples"
    assert report["splits"]["train"]["pairs"] == len(toy_pairs) - 6
    assert report["splits"]["eval"]["pairs"] == 3 and report["splits"]["eval"]["from"] == "dev"
    assert report["input_splits"] == INPUT_SPLITS == {"train": "train/*", "eval": "eval/*"}
    # GZIP tf.Examples with exactly two bytes features, readable by the project's reader.
    record = next(iter(tf.data.TFRecordDataset(str(out / "eval" / "data.tfrecord.gz"),
                                               compression_type="GZIP")))
    example = tf.train.Example.FromString(record.numpy())
    assert sorted(example.features.feature) == ["source", "target"]
    dev = (tmp_path / "data" / "dev.tsv").read_text(encoding="utf-8").splitlines()
    assert read_tfrecord(str(out / "eval")) == [tuple(line.split("\t")) for line in dev]

    csv_report = write_example_gen_input(cfg, fmt="csv")
    assert not (out / "train" / "data.tfrecord.gz").exists(), "one format per directory"
    lines = (out / "eval" / "data.csv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == '"source","target"' and len(lines) == 4
    assert csv_report["format"] == "csv"
    with pytest.raises(UserInputError, match="Unknown ExampleGen input format 'json'"):
        write_example_gen_input(cfg, fmt="json")


def test_cli_registers_the_tfx_commands():
    from aiayn.pipeline.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["tfx-run", "--preset", "tiny", "--beam-arg=--direct_num_workers=1",
                              "--beam-arg", "--runner=DirectRunner --foo=1"])
    from aiayn.pipeline.tfx.commands import _beam_args

    assert _beam_args(args.beam_args) == ["--direct_num_workers=1", "--runner=DirectRunner",
                                          "--foo=1"]
    assert parser.parse_args(["tfx-data", "--format", "csv"]).format == "csv"
    with pytest.raises(SystemExit):  # the cluster paths are required
        parser.parse_args(["tfx-compile", "--image", "x"])


def test_run_fn_trains_on_example_gen_splits_and_writes_the_serving_model(tmp_path, toy_pairs):
    from aiayn.export.saved_model import SERVING_SIGNATURE
    from aiayn.export.verify import verify_export
    from aiayn.pipeline.tfx.trainer import run_fn

    examples = _example_gen_output(tmp_path / "ImportExampleGen" / "examples" / "1",
                                   {"train": toy_pairs, "eval": toy_pairs[:6]})
    cfg = load_config(["tiny"], ["data.vocab_size=200", "train.steps_per_epoch=2",
                                 "train.checkpoint_every=2", "train.average_last=2",
                                 "train.eval_every=0", "train.eval_max_sentences=4",
                                 "decode.beam_size=2", "decode.n_best=2",
                                 "decode.max_extra_length=6", "export.max_input_tokens=24"])
    model_uri = tmp_path / "Trainer" / "model" / "5"
    fn_args = types.SimpleNamespace(
        working_dir=str(model_uri / "Format-Serving"),
        train_files=[str(examples / "Split-train" / "*")],
        eval_files=[str(examples / "Split-eval" / "*")],
        train_steps=4, eval_steps=None,
        schema_path=str(tmp_path / "SchemaGen" / "schema.pbtxt"),
        serving_model_dir=str(model_uri / "Format-Serving"),
        model_run_dir=str(tmp_path / "Trainer" / "model_run" / "5"),
        custom_config={"config": cfg.to_dict(), "preset": "tiny",
                       "overrides": ["train.warmup_steps=2"]},
        data_accessor=None, transform_graph_path=None, hyperparameters=None, base_model=None)

    summary = run_fn(fn_args)

    assert summary["steps"] == 4 and summary["stop_reason"] == "steps"
    serving = Path(fn_args.serving_model_dir)
    assert (serving / "saved_model.pb").exists() and (serving / "variables").is_dir()
    extra = serving / "assets.extra"
    for name in ("tf_serving_warmup_requests", "config.yaml", "spm.model", "model_card.md"):
        assert (extra / name).exists(), name
    exported_cfg = (extra / "config.yaml").read_text(encoding="utf-8")
    assert "steps: 4" in exported_cfg and "warmup_steps: 2" in exported_cfg
    # The run (history, weights, the vocabulary trained on the TRAINING split) is in model_run.
    run_dir = Path(fn_args.model_run_dir)
    assert (run_dir / "final.weights.h5").exists() and (run_dir / "history.json").exists()
    train_tsv = (run_dir / "data" / "train.tsv").read_text(encoding="utf-8").splitlines()
    assert len(train_tsv) == len(toy_pairs)
    assert len((run_dir / "data" / "dev.tsv").read_text(encoding="utf-8").splitlines()) == 6
    # The export verifier (fresh process, stock ops only) accepts it, and it translates.
    report = verify_export(serving)
    assert report.ok, report.problems
    out = report.outputs[SERVING_SIGNATURE]
    assert len(out["translation"]) == len(report.texts) and all(
        isinstance(t, str) for t in out["translation"])


def test_run_fn_reports_empty_splits(tmp_path):
    from aiayn.pipeline.tfx.trainer import run_fn

    examples = _example_gen_output(tmp_path, {"train": [("a b", "c d")]})
    fn_args = types.SimpleNamespace(
        train_files=[str(examples / "Split-train" / "*")], eval_files=[],
        serving_model_dir=str(tmp_path / "serving"), model_run_dir=str(tmp_path / "run"),
        custom_config={"config": load_config(["tiny"]).to_dict()}, train_steps=2)
    with pytest.raises(UserInputError, match="no eval files"):
        run_fn(fn_args)
    assert not (tmp_path / "serving").exists()
