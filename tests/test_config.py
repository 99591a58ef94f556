"""Config: presets, right-most-wins merging, dotted overrides, strict keys, round trip."""

import dataclasses

import pytest

from aiayn.pipeline import config as config_lib
from aiayn.pipeline.config import ConfigError, load_config


def test_presets_shipped():
    assert {"tiny", "small", "base", "big"} <= set(config_lib.available_presets())


@pytest.mark.parametrize("name", ["tiny", "small", "base", "big"])
def test_every_preset_loads_and_validates(name):
    cfg = load_config([name])
    assert cfg.preset == name
    assert cfg.model.hidden_dim % cfg.model.num_heads == 0


def test_base_and_big_follow_paper_table_3():
    base = load_config(["base"])
    assert (base.model.num_layers, base.model.hidden_dim, base.model.intermediate_dim,
            base.model.num_heads, base.model.dropout) == (6, 512, 2048, 8, 0.1)
    assert base.model.hidden_dim // base.model.num_heads == 64  # d_k = d_v = 64
    assert base.train.label_smoothing == 0.1 and base.train.warmup_steps == 4000
    assert (base.train.beta_1, base.train.beta_2, base.train.epsilon) == (0.9, 0.98, 1e-9)
    big = load_config(["big"])
    assert (big.model.hidden_dim, big.model.intermediate_dim, big.model.num_heads,
            big.model.dropout) == (1024, 4096, 16, 0.3)
    assert (base.decode.beam_size, base.decode.length_penalty) == (4, 0.6)


def test_right_most_wins_and_overrides_win_last(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("model:\n  num_layers: 4\ntrain:\n  steps: 7\n")
    cfg = load_config(["small", str(extra)], ["train.steps=9", "data.bucket_boundaries=4,8,16"])
    assert cfg.model.num_layers == 4          # from extra.yaml, over small
    assert cfg.model.hidden_dim == 256        # still small's
    assert cfg.train.steps == 9               # override beats every preset
    assert cfg.data.bucket_boundaries == (4, 8, 16)
    assert cfg.preset == f"small+{extra}"


def test_override_types_are_coerced():
    cfg = load_config(["tiny"], ["model.norm_first=true", "train.max_minutes=2.5",
                                 "data.vocab_size=1_000"])
    assert cfg.model.norm_first is True
    assert cfg.train.max_minutes == 2.5
    assert cfg.data.vocab_size == 1000


def test_unknown_key_names_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown key train\.stepz.*Valid keys of 'train':.*steps"):
        load_config(["tiny"], ["train.stepz=3"])


def test_unknown_section_names_valid_ones(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  steps: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: unknown section 'trainer'.*data, model"):
        load_config([str(bad)])


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError, match=r"Unknown preset 'huge'.*base, big, small, tiny"):
        load_config(["huge"])


@pytest.mark.parametrize("override, message", [
    ("train.steps=abc", r"train\.steps must be an integer, got 'abc'"),
    ("train.steps=1.5", r"train\.steps must be an integer"),
    ("model.norm_first=maybe", r"model\.norm_first must be true or false"),
    ("train.mixed_precision=fp8", r"must be one of auto, float32, mixed_float16"),
    ("train.steps", r"must look like section\.key=value"),
    ("steps=3", r"the key must be section\.key"),
    ("model.num_heads=3", r"`model.num_heads` must divide `model.hidden_dim`.*hidden_dim=16, "
                          r"num_heads=3"),
    ("model.dropout=1.5", r"`model.dropout` must be in \[0, 1\)"),
    ("data.bucket_boundaries=8,4", r"strictly increasing"),
    ("decode.n_best=5", r"`decode.n_best` \(5\) cannot exceed `decode.beam_size` \(2\)"),
])
def test_bad_values_are_rejected_with_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["tiny"], [override])


def test_configs_are_frozen():
    cfg = load_config(["tiny"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.steps = 3  # type: ignore[misc]


def test_write_and_read_round_trip(tmp_path):
    cfg = load_config(["tiny"], ["train.steps=11", "data.bucket_boundaries=4,8"])
    path = config_lib.write_config(cfg, tmp_path / "run" / "config.yaml")
    assert path.read_text().startswith("# Resolved configuration (preset: tiny)")
    assert config_lib.read_config(path) == cfg
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_model_section_matches_model_constructor_names():
    # The model section's names are the Transformer's keyword arguments (docs/CONTRACTS.md).
    names = [f.name for f in dataclasses.fields(config_lib.ModelConfig)]
    assert names[:4] == ["num_layers", "hidden_dim", "intermediate_dim", "num_heads"]
