"""sacreBLEU settings by target language: one choice for dev BLEU, evaluation and the card."""

from __future__ import annotations

import pytest
import sacrebleu

from aiayn.pipeline.config import load_config
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.training import metrics
from aiayn.pipeline.training.metrics import metric_settings, metric_settings_for, score_corpus

HAS_MECAB = metrics.segmenter_available("ja-mecab")


@pytest.mark.parametrize("lang,tokenize", [
    ("en", "13a"), ("es", "13a"), ("de-CH", "13a"), ("ko", "13a"),
    ("zh", "zh"), ("zh-Hant", "zh"), ("zh_TW", "zh"),
    ("ja", "ja-mecab" if HAS_MECAB else "char"), ("ja-JP", "ja-mecab" if HAS_MECAB else "char"),
    ("th", "char"), ("my", "char"),
])
def test_tokenizer_by_target_language(lang, tokenize):
    settings = metric_settings(lang)
    assert settings.bleu_tokenize == tokenize and settings.target_lang == lang
    assert (settings.chrf_char_order, settings.chrf_word_order) == (6, 0)
    assert f"`{tokenize}`" in settings.describe()


def test_chinese_bleu_is_meaningful_only_with_the_zh_tokenizer():
    refs = ["今天天气很好。", "我爱你们。"]
    hyps = ["今天天气不好。", "我爱你们。"]
    zh = score_corpus(hyps, refs, metric_settings("zh"))
    plain = score_corpus(hyps, refs, metric_settings("en"))
    assert "tok:zh" in zh["bleu_signature"] and zh["bleu_tokenize"] == "zh"
    assert "tok:13a" in plain["bleu_signature"]
    # 13a sees each sentence as one "word": one wrong character and the sentence scores zero.
    # The zh tokenizer counts characters, so the near-miss still earns most of its n-grams.
    assert zh["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="zh").score,
                                       abs=0.01)
    assert zh["bleu"] > plain["bleu"] + 20
    assert "nc:6|nw:0" in zh["chrf_signature"]


def test_japanese_uses_mecab_where_it_installs_else_characters(monkeypatch):
    refs, hyps = ["日本語のテキストです。"], ["日本語のテキストだ。"]
    settings = metric_settings("ja")
    signature = score_corpus(hyps, refs, settings)["bleu_signature"]
    if HAS_MECAB:  # the dev extras install sacrebleu[ja]
        assert "tok:ja-mecab-" in signature and "MeCab" in settings.reason
    monkeypatch.setattr(metrics, "segmenter_available", lambda name: False)
    fallback = metric_settings("ja")
    assert fallback.bleu_tokenize == "char" and "aiayn[ja]" in fallback.reason
    assert "tok:char" in score_corpus(hyps, refs, fallback)["bleu_signature"]


def test_config_override_and_its_errors(monkeypatch):
    cfg = load_config(["tiny"], ["data.corpus=c.tsv", "data.source_lang=en",
                                 "data.target_lang=zh", "train.bleu_tokenize=char"])
    settings = metric_settings_for(cfg)
    assert settings.bleu_tokenize == "char" and "train.bleu_tokenize=char" in settings.reason
    auto = load_config(["tiny"], ["data.corpus=c.tsv", "data.source_lang=en",
                                  "data.target_lang=zh"])
    assert metric_settings_for(auto).bleu_tokenize == "zh"
    monkeypatch.setattr(metrics, "_segmenter_error", lambda name: "No module named 'MeCab'")
    with pytest.raises(UserInputError, match=r"train.bleu_tokenize=ja-mecab cannot run here "
                                             r"\(No module named 'MeCab'\).*aiayn\[ja\]"):
        metric_settings("ja", "ja-mecab")


def test_dev_evaluator_scores_with_the_target_languages_settings():
    from aiayn.pipeline.training.dev_bleu import DevEvaluator

    refs = ["今天天气很好。", "我爱你们。"]
    hyps = ["今天天气不好。", "我爱你们。"]
    zh = DevEvaluator(lambda s: hyps, ["a", "b"], refs, every=0, metrics=metric_settings("zh"))
    default = DevEvaluator(lambda s: hyps, ["a", "b"], refs, every=0)
    assert zh.score(hyps)["bleu"] == pytest.approx(
        score_corpus(hyps, refs, metric_settings("zh"))["bleu"], abs=0.01)
    assert zh.score(hyps)["bleu"] > default.score(hyps)["bleu"] + 20


def test_model_card_names_the_tokenizer_used(tmp_path):
    from aiayn.pipeline.release.model_card import write_model_card

    cfg = load_config(["tiny"], ["data.corpus=c.tsv", "data.source_lang=en",
                                 "data.target_lang=zh", f"train.run_dir={tmp_path / 'run'}",
                                 f"data.data_dir={tmp_path / 'data'}"])
    report = {"split": "test", "sentences": 2, **score_corpus(["我爱你"], ["我爱你们"],
                                                             metric_settings_for(cfg))}
    card = write_model_card(cfg, eval_reports={"test": report},
                            data_report={"kept": 3, "dropped": {"length_ratio": 1}})
    assert "Metric settings for target `zh`: BLEU tokenizer `zh`" in card
    assert "| test | " in card and "| `zh` |" in card
    assert f"test bleu: {report['bleu_signature']}" in card
    assert "**Unknown input.**" in card and "unknown_fraction" in card
    assert "character coverage 0.9995" in card


def test_length_by_reference_groups_the_references_shortest_first():
    settings = metric_settings("es")
    # References of 10 down to 1 tokens; each hypothesis one token shorter than its reference,
    # but the one-token reference's, one longer.
    references = [" ".join(["w"] * n) for n in range(10, 0, -1)]
    hypotheses = [" ".join(["w"] * (n - 1)) for n in range(10, 1, -1)] + ["w w"]
    groups = metrics.length_by_reference(hypotheses, references, settings)
    assert groups == [
        {"reference_tokens": [1, 2], "sentences": 2, "hyp_len": 3, "ref_len": 3,
         "length_ratio": 1.0},
        {"reference_tokens": [3, 4], "sentences": 2, "hyp_len": 5, "ref_len": 7,
         "length_ratio": 0.714},
        {"reference_tokens": [5, 6], "sentences": 2, "hyp_len": 9, "ref_len": 11,
         "length_ratio": 0.818},
        {"reference_tokens": [7, 8], "sentences": 2, "hyp_len": 13, "ref_len": 15,
         "length_ratio": 0.867},
        {"reference_tokens": [9, 10], "sentences": 2, "hyp_len": 17, "ref_len": 19,
         "length_ratio": 0.895}]
    # The groups add up to sacreBLEU's own lengths for the corpus.
    detail = score_corpus(hypotheses, references, settings)["bleu_detail"]
    assert "hyp_len = 47 ref_len = 55" in detail


def test_length_by_reference_counts_bleus_tokens_and_handles_small_splits():
    zh = metric_settings("zh")  # a Chinese character is a token
    groups = metrics.length_by_reference(["我爱你", "好"], ["我爱你们。", "很好"], zh, groups=5)
    assert [(g["reference_tokens"], g["sentences"], g["hyp_len"], g["ref_len"])
            for g in groups] == [([2, 2], 1, 1, 2), ([5, 5], 1, 3, 5)]
    assert metrics.length_by_reference([], [], zh) == []
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        metrics.length_by_reference(["a", "b"], ["a"], zh)


def test_the_printed_report_shows_the_length_by_reference_when_it_has_it():
    from aiayn.pipeline.training.split_report import report_line

    report = {"split": "test", "sentences": 4, "bleu": 10.0, "chrf": 30.0, "seconds": 1.0,
              "bleu_signature": "nrefs:1|tok:13a", "chrf_signature": "nrefs:1|nc:6",
              "metric_settings": "BLEU tokenizer `13a`"}
    assert "length" not in report_line(report)  # no groups: an empty split, a bare dict
    report["length_by_reference"] = metrics.length_by_reference(
        ["a", "a b", "a b", "a b c d e"], ["a", "a b c", "a b c", "a b c d"],
        metric_settings("es"), groups=2)
    assert report_line(report).endswith(
        "\n  output/reference length, by reference tokens: 1-3 0.750 | 3-4 1.000")
