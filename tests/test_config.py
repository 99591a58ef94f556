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


def test_zh_en_preset_is_an_overlay_for_the_walkthrough_direction():
    cfg = load_config(["small", "zh_en"], ["data.corpus=my-zh-en.tsv"])
    small = load_config(["small"])
    assert (cfg.data.source_lang, cfg.data.target_lang) == ("zh", "en")
    assert cfg.model == small.model and cfg.train.steps == small.train.steps  # sizes kept
    assert cfg.data.data_dir != small.data.data_dir and cfg.train.run_dir != small.train.run_dir
    assert cfg.export.model_name != small.export.model_name  # served beside the en->es model
    assert cfg.data.corpus == "my-zh-en.tsv" and cfg.preset == "small+zh_en"


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
    with pytest.raises(ConfigError,
                       match=r"unknown key train\.stepz.*Valid keys of 'train':.*steps"):
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
    ("train.steps=abc", r"`train\.steps` must be an integer >= 1; got 'abc'"),
    ("train.steps=1.5", r"`train\.steps` must be an integer >= 1 \(a whole number\); got '1.5'"),
    ("model.norm_first=maybe", r"`model\.norm_first` must be true or false"),
    ("train.mixed_precision=fp8", r"must be one of auto, float32, mixed_float16"),
    ("train.steps", r"must look like section\.key=value"),
    ("steps=3", r"the key must be section\.key"),
    ("model.num_heads=3", r"`model.num_heads` must divide `model.hidden_dim`.*hidden_dim=16, "
                          r"num_heads=3"),
    ("data.bucket_boundaries=8,4", r"strictly increasing"),
    ("decode.n_best=5", r"`decode.n_best` \(5\) cannot exceed `decode.beam_size` \(2\)"),
])
def test_bad_values_are_rejected_with_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["tiny"], [override])


# Every bad value is a ConfigError at load whose message names the field, the value and the valid
# range: (override(s) on the tiny preset, field, value as printed, range as printed).
INT_MAX = "2147483647"
BAD_VALUES = [
    # counts that must be >= 1 (0 and negatives were tracebacks or silently coerced)
    ("model.num_heads=0", "model.num_heads", "0", "an integer >= 1"),
    ("model.num_layers=-2", "model.num_layers", "-2", "an integer >= 1"),
    ("model.hidden_dim=0", "model.hidden_dim", "0", "an integer >= 1"),
    ("model.intermediate_dim=0", "model.intermediate_dim", "0", "an integer >= 1"),
    ("model.max_position=0", "model.max_position", "0", "an integer >= 1"),
    ("train.steps=0", "train.steps", "0", "an integer >= 1"),
    ("train.steps_per_epoch=0", "train.steps_per_epoch", "0", "an integer >= 1"),
    ("train.warmup_steps=0", "train.warmup_steps", "0", "an integer >= 1"),
    ("train.checkpoint_every=0", "train.checkpoint_every", "0", "an integer >= 1"),
    ("train.keep_checkpoints=0", "train.keep_checkpoints", "0", "an integer >= 1"),
    ("train.average_last=0", "train.average_last", "0", "an integer >= 1"),
    ("train.gradient_accumulation_steps=0", "train.gradient_accumulation_steps", "0",
     "an integer >= 1"),
    ("data.shuffle_buffer=0", "data.shuffle_buffer", "0", "an integer >= 1"),
    ("data.token_budget=0", "data.token_budget", "0", "an integer >= 1"),
    ("data.max_length=1", "data.max_length", "1", "an integer >= 2"),
    ("data.vocab_size=4", "data.vocab_size", "4", "an integer >= 5"),
    ("data.bucket_boundaries=0,8", "data.bucket_boundaries", "0", "an integer >= 1"),
    ("decode.beam_size=0", "decode.beam_size", "0", "an integer >= 1"),
    ("decode.n_best=0", "decode.n_best", "0", "an integer >= 1"),
    ("decode.batch_size=0", "decode.batch_size", "0", "an integer >= 1"),
    ("export.max_batch_size=0", "export.max_batch_size", "0", "an integer >= 1"),
    ("export.max_input_tokens=0", "export.max_input_tokens", "0", "an integer >= 1"),
    # counts where 0 has a documented meaning: negatives rejected
    ("train.eval_every=-1", "train.eval_every", "-1", "an integer >= 0 (0 = no dev evaluation)"),
    ("train.eval_max_sentences=-1", "train.eval_max_sentences", "-1",
     "an integer >= 0 (0 = the whole dev split)"),
    ("train.selection_max_sentences=-2", "train.selection_max_sentences", "-2",
     "an integer >= 0 (0 = the whole dev split)"),
    ("train.early_stopping_patience=-3", "train.early_stopping_patience", "-3",
     "an integer >= 0 (0 = off)"),
    ("data.vocab_sample_size=-1", "data.vocab_sample_size", "-1",
     "an integer >= 0 (0 = every sentence)"),
    ("decode.max_extra_length=-1", "decode.max_extra_length", "-1", "an integer >= 0"),
    ("data.subword_alpha=-0.1", "data.subword_alpha", "-0.1",
     "a finite number >= 0 (0 = no sampling)"),
    ("data.subword_nbest=-2", "data.subword_nbest", "-2", "an integer >= -1"),
    ("data.concat_fraction=1.5", "data.concat_fraction", "1.5",
     "a finite number in [0, 1] (0 = off)"),
    ("export.version=-1", "export.version", "-1", "an integer in [0, 9223372036854775807] "
                                                   "(0 = the next version)"),
    ("train.max_minutes=-5", "train.max_minutes", "-5",
     "a finite number >= 0 (0 = no time budget)"),
    ("train.clipnorm=-1", "train.clipnorm", "-1", "a finite number >= 0 (0 = no clipping)"),
    ("train.deadline_minutes=-45", "train.deadline_minutes", "-45",
     "a finite number >= 0 (0 = no deadline)"),
    # seeds
    ("data.seed=-1", "data.seed", "-1", "an integer in [0, 4294967295]"),
    ("train.seed=4294967296", "train.seed", "4294967296", "an integer in [0, 4294967295]"),
    # probabilities in [0, 1)
    ("model.dropout=1.5", "model.dropout", "1.5", "a finite number in [0, 1)"),
    ("model.dropout=1", "model.dropout", "1", "a finite number in [0, 1)"),
    ("model.attention_dropout=-0.1", "model.attention_dropout", "-0.1",
     "a finite number in [0, 1)"),
    ("model.token_dropout=1", "model.token_dropout", "1", "a finite number in [0, 1)"),
    ("train.label_smoothing=1", "train.label_smoothing", "1", "a finite number in [0, 1)"),
    ("train.beta_1=1", "train.beta_1", "1", "a finite number in [0, 1)"),
    ("train.late_dropout=1", "train.late_dropout", "1", "a finite number in [0, 1)"),
    ("train.beta_2=-0.5", "train.beta_2", "-0.5", "a finite number in [0, 1)"),
    ("train.ema_momentum=1", "train.ema_momentum", "1", "a finite number in (0, 1) (0 = off)"),
    # other float ranges
    ("train.learning_rate_scale=0", "train.learning_rate_scale", "0", "a finite number > 0"),
    ("train.epsilon=0", "train.epsilon", "0", "a finite number > 0"),
    ("model.layer_norm_epsilon=-1e-6", "model.layer_norm_epsilon", "-1e-06",
     "a finite number > 0"),
    ("decode.length_penalty=-0.6", "decode.length_penalty", "-0.6", "a finite number >= 0"),
    ("data.character_coverage=0.5", "data.character_coverage", "0.5",
     "a finite number: 0 (by language) or in [0.98, 1]"),
    ("data.max_length_ratio=0.5", "data.max_length_ratio", "0.5",
     "a finite number: 0 (no length-ratio check) or >= 1"),
    ("model.num_decoder_layers=-1", "model.num_decoder_layers", "-1",
     "an integer >= 0 (0 = as many as model.num_layers)"),
    # not finite: 1e400 parses to inf; inf and nan are rejected everywhere
    ("train.steps=1e400", "train.steps", "'1e400'", "an integer >= 1"),
    ("data.max_length=1e400", "data.max_length", "'1e400'", "an integer >= 2"),
    ("train.max_minutes=1e400", "train.max_minutes", "'1e400'", "a finite number >= 0"),
    ("train.max_minutes=inf", "train.max_minutes", "'inf'", "a finite number >= 0"),
    ("model.dropout=nan", "model.dropout", "'nan'", "a finite number in [0, 1)"),
    ("train.learning_rate_scale=-inf", "train.learning_rate_scale", "'-inf'",
     "a finite number > 0"),
    ("data.bucket_boundaries=8,1e400", "data.bucket_boundaries", "'1e400'", "an integer >= 1"),
    # too large for the int32 TensorFlow holds lengths and counts in
    ("train.steps=1e30", "train.steps", "1000000000000000019884624838656",
     f"an integer in [1, {INT_MAX}]"),
    ("data.max_length=99999999999999999999", "data.max_length", "99999999999999999999",
     f"an integer in [2, {INT_MAX}]"),
    # types
    ("train.steps=abc", "train.steps", "'abc'", "an integer >= 1"),
    ("train.steps=true", "train.steps", "'true'", "an integer >= 1"),
    ("train.max_minutes=soon", "train.max_minutes", "'soon'", "a finite number >= 0"),
]


@pytest.mark.parametrize("override, field, value, valid", BAD_VALUES,
                         ids=[b[0] for b in BAD_VALUES])
def test_every_bad_value_names_field_value_and_range(override, field, value, valid):
    with pytest.raises(ConfigError) as info:
        load_config(["tiny"], [override])
    message = str(info.value)
    assert f"`{field}`" in message and valid in message and f"got {value}" in message, message


def test_yaml_values_are_checked_like_overrides(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("train:\n  max_minutes: .inf\n  warmup_steps: 0\n")
    with pytest.raises(ConfigError, match=r"`train\.max_minutes` must be a finite number >= 0 "
                                          r"\(0 = no time budget\); got inf"):
        load_config(["tiny", str(preset)])
    preset.write_text("train:\n  warmup_steps: 0\n")
    with pytest.raises(ConfigError,
                       match=r"^`train\.warmup_steps` must be an integer >= 1; got 0\.$"):
        load_config(["tiny", str(preset)])


@pytest.mark.parametrize("overrides, message", [
    # settings later stages need, checked at load (not after training)
    (["decode.beam_size=2", "decode.n_best=3"],
     r"`decode.n_best` \(3\) cannot exceed `decode.beam_size` \(2\)"),
    (["export.model_name=my/model"], r"`export.model_name` must use letters.*got 'my/model'"),
    (["export.model_name=.."], r"`export.model_name` must use letters.*got '\.\.'"),
    (["export.model_name="], r"`export.model_name` must not be empty"),
    (["export.max_input_tokens=300", "model.max_position=20", "decode.max_extra_length=19"],
     r"`export.max_input_tokens`=300 leaves no room.*max_position=20"),
    (["export.on_long_input=drop"], r"`export.on_long_input` must be one of truncate, reject; "
                                    r"got 'drop'"),
    (["decode.stop_rule=never"], r"`decode.stop_rule` must be one of current, bound; "
                                 r"got 'never'"),
    (["train.decay_shape=cosine"], r"`train.decay_shape` must be one of linear, sqrt; "
                                   r"got 'cosine'"),
    (["model.ffn_activation=glu"], r"`model.ffn_activation` must be one of relu, gelu, swiglu, "
                                   r"geglu; got 'glu'"),
    (["data.output_vocabulary=source"], r"`data.output_vocabulary` must be one of joint, "
                                        r"target; got 'source'"),
    # data
    (["data.token_budget=16"], r"`data.token_budget` \(16\) must be at least `data.max_length` "
                               r"\(32\)"),
    (["data.corpus="], r"`data.corpus` must not be empty"),
    (["data.subword_alpha=0.3", "data.subword_nbest=1"],
     r"`data.subword_nbest` is 1, which samples nothing: use -1.*`data.subword_alpha=0`"),
    (["data.subword_alpha=0.3", "data.output_vocabulary=target"],
     r"`data.output_vocabulary=target` keeps the pieces.*`data.subword_alpha=0`"),
    (["data.data_dir= "], r"`data.data_dir` must not be empty"),
    (["data.source_lang=e n"], r"`data.source_lang` must be a language code.*got 'e n'"),
    # the default corpus is English->Spanish: other languages need the user's own corpus
    (["data.source_lang=zh", "data.target_lang=en"],
     r"`data.corpus` is 'bible'.*source_lang='zh'.*--set data.corpus="),
    (["train.bleu_tokenize=flores200"],
     r"`train.bleu_tokenize` must be one of auto, 13a, intl, zh, ja-mecab.*got 'flores200'"),
    (["data.corpus=c.tsv", "data.dev_corpus=d.tsv"],
     r"`data.dev_corpus` and `data.test_corpus` go together.*test_corpus=''"),
    (["data.corpus=c.tsv", "data.heldout_size=0"],
     r"`data.heldout_size` must be an integer >= 1 when data.dev_corpus.*got 0"),
    # training
    (["train.keep_checkpoints=2", "train.average_last=3"],
     r"`train.average_last` \(3\) cannot exceed `train.keep_checkpoints` \(2\)"),
    (["train.run_dir="], r"`train.run_dir` must not be empty"),
])
def test_settings_that_relate_fields_are_checked_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["tiny"], overrides)


@pytest.mark.parametrize("overrides", [
    ["train.max_minutes=0"],              # 0 = no time budget
    ["train.eval_every=0"],               # 0 = no dev evaluation
    ["train.eval_max_sentences=0"],       # 0 = the whole dev split
    ["train.selection_max_sentences=0"],  # 0 = the whole dev split
    ["train.early_stopping_patience=0"],  # 0 = off
    ["train.clipnorm=0"],                 # 0 = no clipping
    ["data.max_length_ratio=0"],          # 0 = no length-ratio check
    ["data.character_coverage=0"],        # 0 = by language (0.9995 for zh/ja/ko, else 1)
    ["data.vocab_sample_size=0"],         # 0 = every sentence
    ["export.version=0"],                 # 0 = the next version
    ["decode.max_extra_length=0", "decode.beam_size=1", "decode.n_best=1"],
    ["data.corpus=c.tsv", "data.dev_corpus=d.tsv", "data.test_corpus=t.tsv",
     "data.heldout_size=0"],              # unused when dev and test are given
    ["data.heldout_size=0"],              # ignored for the bible corpus
    ["data.subword_nbest=1"],             # no sampling either way (subword_alpha is 0)
    ["data.subword_alpha=0.3", "data.subword_nbest=-1"],
    ["train.steps=1e3", "data.vocab_size=2_000"],
    ["data.bucket_boundaries=4,8,16", "data.shuffle_buffer=1", "data.seed=0"],
])
def test_documented_zeroes_and_edge_values_still_load(overrides):
    load_config(["tiny"], overrides)


def test_every_numeric_field_has_a_range():
    """A new int or float field cannot be added without deciding its valid range."""
    missing = []
    for section, cls in config_lib._SECTION_CLASSES.items():
        for name, typ in config_lib._field_types(cls).items():
            if typ in (int, float) or typ == tuple[int, ...]:
                if (section, name) not in config_lib._BOUNDS:
                    missing.append(f"{section}.{name}")
    assert not missing, f"no range in config._BOUNDS for: {missing}"


def test_paths_expand_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(["tiny"], ["data.corpus=~/corpus.tsv", "data.data_dir=~/data",
                                 "train.run_dir=~/runs/x", "export.base_dir=~/exports",
                                 "data.dev_corpus=~/dev.en, ~/dev.es",
                                 "data.test_corpus=~/test/*.tfrecord.gz"])
    assert cfg.data.corpus == f"{tmp_path}/corpus.tsv"
    assert cfg.data.data_dir == f"{tmp_path}/data"
    assert cfg.train.run_dir == f"{tmp_path}/runs/x"
    assert cfg.export.base_dir == f"{tmp_path}/exports"
    assert cfg.data.dev_corpus == f"{tmp_path}/dev.en,{tmp_path}/dev.es"  # each of the two paths
    assert cfg.data.test_corpus == f"{tmp_path}/test/*.tfrecord.gz"        # the glob is kept
    # From a YAML preset too, and idempotent through the run directory's config.yaml.
    preset = tmp_path / "p.yaml"
    preset.write_text("train:\n  run_dir: ~/from_yaml\n")
    cfg2 = load_config(["tiny", str(preset)])
    assert cfg2.train.run_dir == f"{tmp_path}/from_yaml"
    written = config_lib.write_config(cfg, tmp_path / "config.yaml")
    assert config_lib.read_config(written) == cfg


@pytest.mark.parametrize("corpus", ["bible", "tfds:wmt14_translate/de-en", "data/*.gz",
                                    "relative/c.tsv"])
def test_special_corpus_names_and_plain_paths_are_kept(corpus):
    assert load_config(["tiny"], [f"data.corpus={corpus}"]).data.corpus == corpus


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
