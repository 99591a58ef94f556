"""The push gate's rule (pipeline/tfx/blessing.py), its settings, and how tfx-run reports a
verdict, WITHOUT TFX or TensorFlow (fast).

The rule: blessed when BLEU >= ``tfx.bleu_floor`` and BLEU >= baseline - ``tfx.bleu_margin``
(only the floor when no model was blessed before). ``run_outcome`` reads the verdicts back from
ML Metadata; here a stand-in store holds artifacts shaped like MLMD's.
"""

from __future__ import annotations

import math
import sys
import types

import pytest

from aiayn.pipeline.config import ConfigError, TfxConfig, load_config
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.tfx.blessing import decide


def test_first_model_needs_only_the_floor():
    ok = decide(12.3, floor=1.0, margin=1.0)
    assert ok.blessed and ok.baseline is None
    assert ok.reason == ("blessed: BLEU 12.30 >= the floor tfx.bleu_floor=1; no blessed model "
                         "to compare with yet")
    low = decide(0.4, floor=1.0, margin=1.0)
    assert not low.blessed
    assert low.reason == "not blessed: BLEU 0.40 is below the floor tfx.bleu_floor=1"
    assert decide(1.0, floor=1.0, margin=0.0).blessed, "the floor itself is enough"


def test_margin_below_the_last_blessed_model():
    assert decide(23.5, floor=1.0, margin=1.0, baseline=24.0).blessed  # within the margin
    assert decide(23.0, floor=1.0, margin=1.0, baseline=24.0).blessed  # exactly at it
    assert decide(30.0, floor=1.0, margin=0.0, baseline=24.0).blessed  # better
    worse = decide(3.1, floor=1.0, margin=1.0, baseline=24.0)
    assert not worse.blessed and worse.baseline == 24.0
    assert worse.reason == ("not blessed: BLEU 3.10 is 20.90 below the last blessed model's 24.00 "
                            "(allowed: tfx.bleu_margin=1)")
    # margin 0: any loss against the baseline refuses the push
    assert not decide(23.99, floor=0.0, margin=0.0, baseline=24.0).blessed
    # the floor is checked first, with or without a baseline
    assert "below the floor" in decide(0.5, floor=2.0, margin=50.0, baseline=1.0).reason


def test_a_score_that_is_not_a_number_is_never_blessed():
    for bad in (math.nan, math.inf, None):
        result = decide(bad, floor=0.0, margin=100.0)
        assert not result.blessed and "not a finite number" in result.reason


@pytest.mark.parametrize("floor, margin, name", [
    (-1.0, 1.0, "tfx.bleu_floor"), (101.0, 1.0, "tfx.bleu_floor"),
    (math.nan, 1.0, "tfx.bleu_floor"),
    (1.0, -0.5, "tfx.bleu_margin"), (1.0, "1", "tfx.bleu_margin"), (1.0, True, "tfx.bleu_margin")])
def test_thresholds_out_of_range_name_the_setting(floor, margin, name):
    with pytest.raises(UserInputError, match=rf"`{name}` must be a number of BLEU points in "
                                             rf"\[0, 100\]; got .* --set {name}=VALUE"):
        decide(10.0, floor=floor, margin=margin)


def test_tfx_settings_are_config_keys_with_documented_defaults():
    cfg = load_config(["tiny"], ["tfx.bleu_floor=5", "tfx.bleu_margin=0.5",
                                 "tfx.eval_sentences=0"])
    assert (cfg.tfx.bleu_floor, cfg.tfx.bleu_margin, cfg.tfx.eval_sentences) == (5.0, 0.5, 0)
    assert cfg.to_dict()["tfx"] == {"bleu_floor": 5.0, "bleu_margin": 0.5, "eval_sentences": 0}
    assert TfxConfig() == load_config(["small"]).tfx == TfxConfig(1.0, 1.0, 500)


@pytest.mark.parametrize("override, message", [
    ("tfx.bleu_floor=-1", r"`tfx.bleu_floor` must be a finite number in \[0, 100\]; got -1"),
    ("tfx.bleu_margin=120", r"`tfx.bleu_margin` must be a finite number in \[0, 100\]; got 120"),
    ("tfx.eval_sentences=-3", r"`tfx.eval_sentences` must be an integer >= 0 \(0 = the whole "
                              r"eval split\); got -3"),
    ("tfx.bleu_flor=2", r"unknown key tfx.bleu_flor\. Valid keys of 'tfx': bleu_floor, "
                        r"bleu_margin, eval_sentences"),
])
def test_bad_tfx_settings_are_one_line_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["tiny"], [override])


def test_the_pipeline_takes_the_gate_from_the_config():
    from aiayn.pipeline.tfx.definition import _gate

    cfg = load_config(["tiny"], ["tfx.bleu_floor=2.5", "tfx.eval_sentences=7",
                                 "decode.batch_size=3"])
    assert _gate(cfg.to_dict()) == {"bleu_floor": 2.5, "bleu_margin": 1.0, "eval_sentences": 7,
                                    "batch_size": 3, "target_lang": "es",
                                    "bleu_tokenize": "auto"}
    # A config written before the tfx section existed: the defaults.
    old = {k: v for k, v in cfg.to_dict().items() if k != "tfx"}
    assert _gate(old)["bleu_floor"] == TfxConfig().bleu_floor
    with pytest.raises(UserInputError, match="tfx.eval_sentences"):
        _gate({"tfx": {"eval_sentences": -1}})


# --- run_outcome: the verdicts tfx-run prints, read from (a stand-in for) ML Metadata ---------

class _Value:
    def __init__(self, kind, value):
        self.kind, self.value = kind, value
        setattr(self, kind, value)

    def WhichOneof(self, _):  # noqa: N802  (the protobuf method name)
        return self.kind


def _artifact(artifact_id, **props):
    kinds = {int: "int_value", float: "double_value", str: "string_value"}
    return types.SimpleNamespace(id=artifact_id, uri=f"/root/x/{artifact_id}", custom_properties={
        k: _Value(kinds[type(v)], v) for k, v in props.items()})


class _Store:
    def __init__(self, by_type):
        self.by_type = by_type

    def get_artifacts_by_type(self, name):
        return list(self.by_type.get(name, []))


def _outcome(monkeypatch, by_type, after_id):
    from aiayn.pipeline.tfx import runners

    monkeypatch.setattr(runners, "_store", lambda connection: _Store(by_type))
    return runners.run_outcome(object(), after_id=after_id)


def test_run_outcome_says_why_nothing_was_pushed(monkeypatch):
    earlier = _artifact(3, blessed=1, reason="blessed: an earlier run", bleu=60.0)
    worse = _artifact(12, blessed=0, bleu=0.5, baseline_bleu=61.5, baseline_model_id=2,
                      reason="not blessed: BLEU 0.50 is 61.00 below the last blessed model's "
                             "61.50 (allowed: tfx.bleu_margin=1)")
    infra = _artifact(13, blessed=1, reason="infra blessed: loads", warmup_requests=15)
    out = _outcome(monkeypatch, {"ModelBlessing": [earlier, worse], "InfraBlessing": [infra],
                                 "PushedModel": [_artifact(14, pushed=0)]}, after_id=10)
    assert not out["blessed"] and not out["pushed"]
    assert out["reason"] == worse.custom_properties["reason"].value, "only the refusal is named"
    assert out["evaluation"]["id"] == 12, "an earlier run's blessing does not count"
    assert out["evaluation"]["blessed"] is False and out["evaluation"]["baseline_model_id"] == 2
    assert out["evaluation"]["bleu"] == 0.5 and out["infra"]["warmup_requests"] == 15


def test_run_outcome_when_blessed_or_when_a_verdict_is_missing(monkeypatch):
    good = _artifact(21, blessed=1, reason="blessed: BLEU 61.52 >= the floor")
    infra = _artifact(22, blessed=1, reason="infra blessed: loads")
    out = _outcome(monkeypatch, {"ModelBlessing": [good], "InfraBlessing": [infra],
                                 "PushedModel": [_artifact(23, pushed=1)]}, after_id=20)
    assert out["blessed"] and out["pushed"]
    assert out["reason"] == "blessed: BLEU 61.52 >= the floor; infra blessed: loads"
    bad_infra = _artifact(22, blessed=0, reason="infra not blessed: op Foo is a custom op")
    out = _outcome(monkeypatch, {"ModelBlessing": [good], "InfraBlessing": [bad_infra]},
                   after_id=20)
    assert not out["blessed"] and out["reason"] == "infra not blessed: op Foo is a custom op"
    out = _outcome(monkeypatch, {"ModelBlessing": [good]}, after_id=20)
    assert not out["blessed"] and out["reason"] == "InfraCheck: no verdict recorded"


def test_the_rule_imports_no_tensorflow_and_no_tfx():
    import subprocess

    code = ("import sys; import aiayn.pipeline.tfx.blessing, aiayn.pipeline.tfx.runners, "
            "aiayn.pipeline.tfx.definition; "
            "print(sorted(m for m in ('tensorflow', 'tfx', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out.splitlines()[-1] == "[]"
