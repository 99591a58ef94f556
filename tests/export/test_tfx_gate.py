"""The bodies of the TFX push gate on a real export, WITHOUT TFX: the BLEU evaluation
(pipeline/tfx/evaluator.py), the infra check (pipeline/tfx/infra.py) and the verifier's warmup
replay it relies on (export/verify.py, ``replay_warmup=True``).

The export is the session's tiny model (tests/export/conftest.py). The gate's rule itself is
tested in tests/test_tfx_blessing.py; the whole pipeline in tests/test_tfx_pipeline.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WARMUP = Path("assets.extra") / "tf_serving_warmup_requests"


def _copy(path: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy" / "1"
    shutil.copytree(path, copy)
    return copy


def test_verifier_replays_the_warmup_requests(exported, tmp_path):
    """A request for a signature the export lacks fails as TF Serving would fail it; the others
    are replayed. (The good export's replay: test_infra_check_blesses_a_servable_model_only.)"""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    from aiayn.export import verify
    from aiayn.export.warmup import read_warmup_requests

    _, path = exported
    broken = _copy(path, tmp_path)
    logs = read_warmup_requests(path / WARMUP)
    request = predict_pb2.PredictRequest()
    request.CopyFrom(logs[0].predict_log.request)
    request.model_spec.signature_name = "no_such_signature"
    with tf.io.TFRecordWriter(str(broken / WARMUP)) as writer:
        for log in [*logs, prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))]:
            writer.write(log.SerializeToString())
    report = verify.verify_export(broken, replay_warmup=True)
    assert report.problems == [f"warmup request {len(logs) + 1} (no_such_signature): no such "
                               "signature"]
    assert report.warmup_requests == len(logs)

    # No warmup file: TF Serving would load the version cold (found before any child runs).
    (broken / WARMUP).unlink()
    requests, problems = verify._warmup_requests(broken)
    assert requests == [] and len(problems) == 1 and "no warmup requests" in problems[0]


def test_infra_check_blesses_a_servable_model_only(exported, tmp_path):
    from aiayn.export.warmup import read_warmup_requests
    from aiayn.pipeline.tfx.infra import infra_check

    _, path = exported
    out = tmp_path / "InfraCheck" / "blessing" / "7"
    result = infra_check(str(path), str(out))
    assert result["blessed"] and result["problems"] == [], result
    assert result["warmup_requests"] == len(read_warmup_requests(path / WARMUP))
    assert result["samples"] > 0 and result["signatures"] == ["n_best", "serving_default"]
    assert (out / "INFRA_BLESSED").exists() and not (out / "INFRA_NOT_BLESSED").exists()
    assert json.loads((out / "infra_check.json").read_text())["reason"] == result["reason"]
    assert result["reason"].startswith("infra blessed: loads in a fresh TensorFlow + "
                                       "tensorflow-text process")

    # A warmup file the server cannot read: not blessed, and the reason says so.
    broken = _copy(path, tmp_path)
    (broken / WARMUP).write_bytes(b"not a TFRecord")
    out = tmp_path / "InfraCheck" / "blessing" / "8"
    result = infra_check(str(broken), str(out))
    assert not result["blessed"] and (out / "INFRA_NOT_BLESSED").exists()
    assert result["reason"].startswith("infra not blessed: the warmup file "
                                       "tf_serving_warmup_requests cannot be read"), result

    # No SavedModel at all (a Trainer that wrote nothing usable).
    (tmp_path / "empty").mkdir()
    result = infra_check(str(tmp_path / "empty"), str(tmp_path / "InfraCheck" / "9"))
    assert not result["blessed"] and "no saved_model.pb" in result["reason"]


def test_evaluation_scores_the_served_graph_and_applies_the_rule(exported, translator,
                                                                 toy_pairs, tmp_path):
    from aiayn.pipeline.tfx.evaluator import evaluate_and_bless
    from aiayn.pipeline.tfx.examples import write_tfrecord
    from aiayn.pipeline.training.metrics import metric_settings, score_corpus

    _, path = exported
    pairs = toy_pairs[:8]
    split = tmp_path / "ImportExampleGen" / "examples" / "1" / "Split-eval"
    write_tfrecord(split / "data_tfrecord-00000-of-00001.gz", pairs)

    def run(out: str, **kwargs):
        args = {"eval_patterns": [f"{split}/*"], "model_dir": str(path), "baseline_dir": None,
                "floor": 0.0, "margin": 1.0, "eval_sentences": 0, "batch_size": 16,
                "target_lang": "es", "bleu_tokenize": "auto"}
        return evaluate_and_bless(output_dir=str(tmp_path / out), **{**args, **kwargs})

    first = run("first")
    # The translations are the served graph's: the in-process Translator agrees string for
    # string (one batch each: the search budget depends on the batch's longest input), and
    # the scores are sacreBLEU's on them.
    want = [t.decode() for t in translator.translate([s for s, _ in pairs])["translation"]]
    got = json.loads((tmp_path / "first" / "evaluation.json").read_text())
    assert [e["translation"] for e in got["examples"]] == want[:len(got["examples"])]
    expected = score_corpus(want, [t for _, t in pairs], metric_settings("es"))
    assert (first["bleu"], first["chrf"]) == (expected["bleu"], expected["chrf"])
    assert first["bleu_signature"] == expected["bleu_signature"]
    assert first["blessed"] and first["eval_sentences"] == 8 and "baseline_bleu" not in first
    assert (tmp_path / "first" / "BLESSED").exists() and got["reason"] == first["reason"]

    # Against a baseline (here the same model, re-scored on the same sentences): margin 0 holds.
    same = run("same", baseline_dir=str(path), margin=0.0)
    assert same["blessed"] and same["baseline_bleu"] == same["bleu"] == first["bleu"]
    assert "within tfx.bleu_margin=0 of the last blessed model's" in same["reason"]

    # A floor the model does not reach: NOT_BLESSED, and why.
    floor = first["bleu"] + 1.0
    refused = run("refused", floor=floor)
    assert not refused["blessed"] and (tmp_path / "refused" / "NOT_BLESSED").exists()
    assert not (tmp_path / "refused" / "BLESSED").exists()
    assert refused["reason"] == (f"not blessed: BLEU {first['bleu']:.2f} is below the floor "
                                 f"tfx.bleu_floor={floor:g}")

    # The first N sentences, in batches of 1; BLEU tokenized for the target language.
    two = run("two", eval_sentences=2, batch_size=1, target_lang="zh")
    assert two["eval_sentences"] == 2 and two["bleu_tokenize"] == "zh"
    assert "|tok:zh|" in two["bleu_signature"] and "|tok:13a|" in first["bleu_signature"]
    assert [e["source"] for e in two["examples"]] == [s for s, _ in pairs[:2]]
