"""The CTranslate2 export: the converted model is the Keras model, and the CLI uses it.

* Weight mapping (fast, random weights; post-norm + tied, pre-norm + untied, a deep encoder,
  the GELU and gated feed-forward activations): CTranslate2's
  greedy tokens equal the Keras model's and its summed log-probabilities agree, so every
  weight (interleaved positions, sqrt(d) scaling, fused projections, norms, biases, the tied
  output layer) lands where CTranslate2 reads it.
* The tiny end-to-end model of tests/export/conftest.py (slow: it trains): greedy output is
  token-identical to the Keras model and text-identical to the SavedModel's graph on sentences
  written here (ordinary, over-long, CJK, unknown-only, empty); beam-4 BLEU is within 0.2 of
  the SavedModel's; `aiayn export --format ctranslate2 [--quantization int8]` and `aiayn
  translate --engine ctranslate2` work; a missing export is one line naming the path and the
  command that creates it; a failed check publishes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.export.serving_helpers import HARD_SENTENCES, LONG

SAMPLE = HARD_SENTENCES + [""]  # "": no pieces at all, "" with score 0


def _options(cfg):
    from aiayn.export.saved_model import ServingOptions

    return ServingOptions.from_configs(cfg.decode, cfg.export)


@pytest.mark.parametrize("norm_first,tie_embeddings,depths,activation,output",
                         [(False, True, (2, 0), "relu", "joint"),
                          (True, False, (2, 0), "relu", "joint"),
                          (False, True, (3, 1), "relu", "joint"),
                          (False, True, (2, 0), "swiglu", "joint"),
                          (True, True, (2, 0), "geglu", "joint"),
                          (False, True, (2, 0), "gelu", "joint"),
                          (False, True, (2, 0), "relu", "target"),
                          (True, False, (2, 0), "relu", "target")],
                         ids=["post-norm-tied", "pre-norm-untied", "deep-encoder-shallow-decoder",
                              "swiglu", "pre-norm-geglu", "gelu", "target-vocabulary-tied",
                              "target-vocabulary-untied"])
def test_conversion_reproduces_the_keras_model(norm_first, tie_embeddings, depths, activation,
                                               output, toy_config, toy_tokenizer, tmp_path):
    import keras

    from aiayn.export import ctranslate2 as ct2
    from aiayn.pipeline.training.artifacts import build_model

    cfg = dataclasses.replace(
        toy_config, model=dataclasses.replace(
            toy_config.model, norm_first=norm_first, tie_embeddings=tie_embeddings,
            num_layers=depths[0], num_decoder_layers=depths[1], ffn_activation=activation),
        data=dataclasses.replace(toy_config.data, output_vocabulary=output))
    keras.utils.set_random_seed(7)
    model = build_model(cfg, toy_tokenizer, dtype="float32")
    if output == "target":  # the toy corpus's English-only pieces are not CTranslate2's targets
        assert 4 < len(model.output_ids) < toy_tokenizer.vocabulary_size
    rng = np.random.default_rng(0)
    for variable in model.weights:  # biases, gammas and betas away from 0 / 1: they count
        if variable.path.endswith(("bias", "gamma", "beta")):
            variable.assign(variable + rng.normal(0, 0.5, variable.shape).astype("float32"))
    path = ct2.convert(model, toy_tokenizer, _options(cfg), tmp_path / "ct2")
    translator = ct2.CTranslate2Translator(path, intra_threads=1)
    texts = ["I love you.", LONG, "我爱你", "Peace be with you, my friend."]

    got, got_scores = translator.greedy(texts)
    want, want_scores = ct2.keras_greedy(model, toy_tokenizer, texts,
                                         translator.settings["input_limit"],
                                         translator.settings["max_extra_length"])
    assert got == want
    # Random weights often repeat one token; the summed log-probabilities see every logit of
    # every step (positions, scaling, norms, biases, the output layer).
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-4, atol=1e-3)


def test_the_featuriser_matches_the_in_graph_one(toy_config, toy_tokenizer, tmp_path):
    """Python SentencePiece + truncation = `SubwordTokenizer.featurize_source`, id for id."""
    import keras
    import tensorflow as tf

    from aiayn.export import ctranslate2 as ct2
    from aiayn.pipeline.training.artifacts import build_model

    keras.utils.set_random_seed(1)
    model = build_model(toy_config, toy_tokenizer, dtype="float32")
    cfg = dataclasses.replace(toy_config, export=dataclasses.replace(toy_config.export,
                                                                     max_input_tokens=12))
    translator = ct2.CTranslate2Translator(ct2.convert(model, toy_tokenizer, _options(cfg),
                                                       tmp_path / "ct2"))
    limit = translator.settings["input_limit"]
    assert limit == 12
    texts = SAMPLE + ["   ", "Ｆｕｌｌ-width ＡＢＣ"]  # whitespace only; NFKC-normalised
    got = translator.featurize(texts)
    features = toy_tokenizer.featurize_source(tf.constant(texts), limit)
    mask = np.asarray(features.padding_mask)
    ids = np.asarray(features.token_ids)
    for row, (pieces, is_empty) in enumerate(zip(got.tokens, got.empty)):
        want = [] if is_empty else ids[row][mask[row]].tolist()
        assert [translator.piece_ids[p] for p in pieces] == want
    assert got.truncated == np.asarray(features.truncated).tolist() and any(got.truncated)
    assert got.empty == np.asarray(features.empty).tolist() and sum(got.empty) == 2
    # The unknown fraction (`aiayn translate` warns above one half): the runic line is all
    # unknown, the CJK line (characters the toy corpus has) is not.
    np.testing.assert_allclose(got.unknown_fraction, np.asarray(features.unknown_fraction),
                               atol=1e-6)
    assert got.unknown_fraction[SAMPLE.index("ᚠᚢᚦ ᚨᚱᚲ")] == 1.0
    assert got.unknown_fraction[SAMPLE.index("我爱你")] == 0.0


def test_without_ctranslate2_installed_the_error_says_how_to_install_it(monkeypatch):
    from aiayn.export import ctranslate2 as ct2

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` fails
    with pytest.raises(ct2.CTranslate2Error, match=r"pip install '\.\[ct2\]'"):
        ct2.import_ctranslate2()


def test_no_ctranslate2_export_is_one_line_naming_path_and_command(toy_config, tmp_path,
                                                                   capsys):
    from aiayn.pipeline.cli import main

    base = tmp_path / "exports"
    code = main(["translate", "--preset", "tiny", "--set", f"export.base_dir={base}",
                 "--engine", "ctranslate2", "--quantization", "int8", "Hello."])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(base / "ctranslate2" / "translate-int8") in err
    assert "aiayn export --preset tiny --format ctranslate2 --quantization int8" in err


# -- the tiny end-to-end model (trains: slow) ---------------------------------------------------
@pytest.fixture(scope="module")
def ct2_cfg(export_cfg, trained_model, tmp_path_factory):
    """export_cfg with its own export base (the session's SavedModel base stays as it is)."""
    base = tmp_path_factory.mktemp("ct2") / "exports"
    return dataclasses.replace(export_cfg, export=dataclasses.replace(export_cfg.export,
                                                                      base_dir=str(base)))


@pytest.fixture(scope="module")
def ct2_export(ct2_cfg):
    from aiayn.pipeline.release.export_run import export_run_ctranslate2

    return export_run_ctranslate2(ct2_cfg)


@pytest.mark.slow
def test_layout_beside_the_savedmodel_versions(ct2_cfg, ct2_export):
    from aiayn.export.ctranslate2 import SETTINGS_FILE
    from aiayn.export.saved_model import list_versions

    base = ct2_cfg.export.base_dir
    assert ct2_export == ct2_export.parents[2] / "ctranslate2" / "translate" / "1"
    assert str(ct2_export).startswith(str(base))
    for name in ("model.bin", "config.json", "shared_vocabulary.json", "spm.model",
                 SETTINGS_FILE, "config.yaml"):
        assert (ct2_export / name).is_file(), name
    settings = json.loads((ct2_export / SETTINGS_FILE).read_text())
    assert settings["input_limit"] == 24 and settings["max_extra_length"] == 8
    # Never taken for a SavedModel servable (models.config, the development server).
    assert list_versions(ct2_export.parents[1]) == []
    assert not [p for p in ct2_export.parent.iterdir() if p.name.startswith(".tmp")]


@pytest.mark.slow
def test_greedy_is_token_identical_to_keras_and_text_identical_to_the_savedmodel(
        ct2_cfg, ct2_export, trained_model, toy_tokenizer):
    import tensorflow as tf

    from aiayn.export import ctranslate2 as ct2
    from aiayn.pipeline.training.validation import make_translator

    translator = ct2.CTranslate2Translator(ct2_export, intra_threads=1)
    limit = translator.settings["input_limit"]
    # The sample means what it says: one input over the limit, one of unknown pieces only.
    pieces = toy_tokenizer.tokenize(tf.constant(SAMPLE)).to_list()
    assert len(pieces[SAMPLE.index(LONG)]) > limit
    assert toy_tokenizer.unk_id in pieces[SAMPLE.index("ᚠᚢᚦ ᚨᚱᚲ")]

    got = translator.greedy_ids(SAMPLE)
    want, _ = ct2.keras_greedy(trained_model, toy_tokenizer, SAMPLE, limit,
                               translator.settings["max_extra_length"])
    assert got == want
    assert sum(1 for row in want if row) >= 5  # the model does emit tokens

    greedy = dataclasses.replace(ct2_cfg, decode=dataclasses.replace(ct2_cfg.decode,
                                                                     beam_size=1, n_best=1))
    served = make_translator(greedy, trained_model, toy_tokenizer).translate(SAMPLE)
    results = translator.translate(SAMPLE, beam_size=1)
    assert [r.text for r in results] == [t.decode() for t in served["translation"]]
    assert results[SAMPLE.index("")].text == "" and results[SAMPLE.index("")].score == 0.0
    assert [r.truncated for r in results] == [s == LONG for s in SAMPLE]


@pytest.mark.slow
def test_beam4_bleu_within_0_2_of_the_savedmodel(ct2_cfg, ct2_export, trained_model,
                                                  toy_tokenizer, toy_pairs):
    from aiayn.export.ctranslate2 import CTranslate2Translator
    from aiayn.pipeline.training.validation import make_translator, score, translate_sentences

    beam4 = dataclasses.replace(ct2_cfg, decode=dataclasses.replace(ct2_cfg.decode,
                                                                    beam_size=4, n_best=1))
    sources = [s for s, _ in toy_pairs]
    references = [t for _, t in toy_pairs]
    served = translate_sentences(make_translator(beam4, trained_model, toy_tokenizer), sources,
                                 batch_size=8)
    translator = CTranslate2Translator(ct2_export, intra_threads=1)
    ct2_out = translator.translate_sentences(sources, batch_size=8, beam_size=4)
    bleu_served = score(served, references)["bleu"]
    bleu_ct2 = score(ct2_out, references)["bleu"]
    # The fixture's model is barely trained (BLEU about 2 on its own training pairs) but does
    # emit text for most sentences, so the bound compares two real outputs, not 0 with 0.
    assert sum(map(bool, served)) >= 0.75 * len(sources) and bleu_served > 0
    assert abs(bleu_ct2 - bleu_served) <= 0.2, (bleu_ct2, bleu_served)


def _preset_file(cfg, tmp_path):
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
    return str(path)


@pytest.mark.slow
def test_cli_export_int8_and_translate_with_the_ctranslate2_engine(ct2_cfg, ct2_export,
                                                                   tmp_path, capsys):
    from aiayn.export.ctranslate2 import CTranslate2Translator
    from aiayn.pipeline.cli import main

    preset = _preset_file(ct2_cfg, tmp_path)
    texts = ["I love you.", "Where is the house of my father?"]
    assert main(["translate", "--preset", preset, "--engine", "ctranslate2", *texts]) == 0
    out = capsys.readouterr().out.splitlines()
    expected = [r.text for r in CTranslate2Translator(ct2_export).translate(texts)]
    assert out == expected and all(out)

    assert main(["export", "--preset", preset, "--format", "ctranslate2",
                 "--quantization", "int8"]) == 0
    int8_dir = ct2_export.parents[1] / "translate-int8" / "1"
    assert (int8_dir / "model.bin").is_file()
    assert json.loads((int8_dir / "aiayn_ct2.json").read_text())["quantization"] == "int8"
    assert (int8_dir / "model.bin").stat().st_size < (ct2_export / "model.bin").stat().st_size
    capsys.readouterr()
    assert main(["translate", "--preset", preset, "--engine", "ctranslate2",
                 "--quantization", "int8", "--scores", texts[0]]) == 0
    score, text = capsys.readouterr().out.strip().split("\t")
    assert float(score) < 0 and text

    assert main(["export", "--preset", preset, "--quantization", "int8"]) == 2  # SavedModel
    assert "--format ctranslate2 only" in capsys.readouterr().err


@pytest.mark.slow
def test_the_ctranslate2_engine_translates_without_loading_tensorflow(ct2_cfg, ct2_export,
                                                                       tmp_path):
    from aiayn.export.ctranslate2 import CTranslate2Translator

    preset = _preset_file(ct2_cfg, tmp_path)
    script = ("import sys\n"
              "from aiayn.pipeline.cli import main\n"
              f"code = main(['translate', '--preset', {preset!r}, '--engine', 'ctranslate2', "
              "'I love you.'])\n"
              "print('tensorflow loaded' if 'tensorflow' in sys.modules else 'no tensorflow')\n"
              "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    expected = CTranslate2Translator(ct2_export).translate(["I love you."])[0].text
    assert done.stdout.splitlines() == [expected, "no tensorflow"]


@pytest.mark.slow
def test_a_failed_check_publishes_nothing(ct2_cfg, trained_model, toy_tokenizer, tmp_path,
                                          monkeypatch):
    from aiayn.export import ctranslate2 as ct2

    def refuse(*args, **kwargs):
        raise ct2.CTranslate2Error("refused by the test")

    monkeypatch.setattr(ct2, "verify_ct2_export", refuse)
    with pytest.raises(ct2.CTranslate2Error, match="refused by the test"):
        ct2.export_ctranslate2(trained_model, toy_tokenizer, tmp_path, "translate",
                               _options(ct2_cfg), sample_texts=["I love you."])
    model_dir = tmp_path / "ctranslate2" / "translate"
    assert model_dir.is_dir() and list(model_dir.iterdir()) == []  # no version, no .tmp-*
