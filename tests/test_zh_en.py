"""The paper's own example end to end: 我爱你 -> "I love you", and BLEU for en -> zh.

A small Chinese-English corpus written here (294 short pairs in the style of 我爱你 -> "I love
you.", 你好 -> "Hello."), then the whole pipeline as a user runs it with the ``zh_en`` preset:
data (the weighted length-ratio check) -> vocabulary -> training (tiny) -> export -> the
SavedModel answers Chinese input with English output. The reverse direction (en -> zh, with
the walkthrough's one-token-per-character vocabulary) is scored with sacreBLEU's ``zh``
tokenizer, chosen from the target language.
"""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.slow

SUBJECTS = [("我", "I"), ("你", "you"), ("他", "he"), ("她", "she"), ("我们", "we"),
            ("他们", "they")]
VERBS = [("爱", "love"), ("喜欢", "like"), ("看见", "see")]
OBJECTS = [("你", "you"), ("我", "me"), ("他", "him"), ("她", "her"), ("我们", "us"),
           ("他们", "them"), ("猫", "the cat"), ("狗", "the dog"), ("茶", "tea")]
GREETINGS = [("你好", "Hello."), ("谢谢", "Thank you."), ("再见", "Goodbye."),
             ("早上好", "Good morning."), ("晚上好", "Good evening."), ("晚安", "Good night.")]


def zh_en_pairs() -> list[tuple[str, str]]:
    """我爱你 -> I love you., 他不喜欢猫 -> He does not like the cat., 你好 -> Hello., ..."""
    pairs = list(GREETINGS)
    for zs, es in SUBJECTS:
        third = es in ("he", "she")
        for zv, ev in VERBS:
            for zo, eo in OBJECTS:
                if zs == zo:
                    continue
                pairs.append((f"{zs}{zv}{zo}", f"{es.capitalize()} {ev}{'s' * third} {eo}."))
                pairs.append((f"{zs}不{zv}{zo}",
                              f"{es.capitalize()} {'does' if third else 'do'} not {ev} {eo}."))
    return pairs


# A tiny model that learns the toy pairs in a couple of hundred steps on 2 CPU cores.
SETTINGS = ["data.heldout_size=12", "data.max_length=40", "data.bucket_boundaries=8,16,24,32,40",
            "data.token_budget=1024", "model.hidden_dim=64", "model.intermediate_dim=128",
            "model.num_heads=4", "model.dropout=0.0", "train.warmup_steps=40",
            "train.learning_rate_scale=0.7", "train.label_smoothing=0.0",
            "train.mixed_precision=float32", "train.steps_per_epoch=50", "train.eval_every=0",
            "train.checkpoint_every=50", "train.keep_checkpoints=2", "train.average_last=1",
            "decode.beam_size=1", "decode.n_best=1", "decode.max_extra_length=30",
            "export.max_input_tokens=32"]


def _config(root, *overrides):
    from aiayn.pipeline.config import load_config

    return load_config(["tiny", "zh_en"], [
        f"data.data_dir={root / 'data'}", f"train.run_dir={root / 'run'}",
        f"export.base_dir={root / 'exports'}", *SETTINGS, *overrides])


@pytest.fixture(scope="module")
def corpus_tsv(tmp_path_factory):
    path = tmp_path_factory.mktemp("zh_en_corpus") / "zh-en.tsv"
    path.write_text("".join(f"{z}\t{e}\n" for z, e in zh_en_pairs()), encoding="utf-8")
    return path


def test_zh_to_en_data_vocab_train_export_answers_in_english(corpus_tsv, tmp_path):
    from aiayn.export.client import LocalClient
    from aiayn.pipeline.data.corpus import prepare_data
    from aiayn.pipeline.data.vocab import train_vocab
    from aiayn.pipeline.release.export_run import export_run
    from aiayn.pipeline.training.train import train

    cfg = _config(tmp_path, f"data.corpus={corpus_tsv}", "data.vocab_model_type=unigram",
                  "data.vocab_size=100", "train.steps=120")
    assert (cfg.data.source_lang, cfg.data.target_lang) == ("zh", "en")
    report = prepare_data(cfg)
    # The weighted length check keeps every real pair (counted in characters, most of them
    # have a ratio above 3: "我爱你" / "I love you." is 3 / 11).
    assert report["kept"] == len(zh_en_pairs()) and report["dropped"] == {}
    train_vocab(cfg)
    summary = train(cfg)
    assert summary["end_state"] == "complete"
    path = export_run(cfg, verify=False)  # the fresh-process verifier: tests/export/
    assert path.parent.name == "translate_zh_en"
    card = (path / "assets.extra" / "model_card.md").read_text(encoding="utf-8")
    assert "zh -> en translation" in card and '"我爱你"' in card

    client = LocalClient(path)
    sources = [z for z, _ in zh_en_pairs()][::4]  # a quarter of them: enough, and faster
    references = [e for _, e in zh_en_pairs()][::4]
    results = client.translate(sources)
    latin = re.compile(r"[A-Za-z][A-Za-z .,']*[.!?]?")
    assert all(latin.fullmatch(r.text) for r in results), [r.text for r in results][:10]
    # The served model learned the toy pairs: the paper's example, and most of the rest.
    assert client.translate(["我爱你"])[0].text == "I love you."
    exact = sum(r.text == e for r, e in zip(results, references))
    assert exact >= 0.8 * len(sources), exact
    nbest = client.translate(["我爱你", "Привет мир"], n_best=True)
    assert [r.unknown_fraction for r in nbest] == [0.0, 1.0]


def test_en_to_zh_char_vocabulary_and_bleu_with_the_zh_tokenizer(corpus_tsv, tmp_path):
    import sacrebleu

    from aiayn.pipeline.data.corpus import prepare_data
    from aiayn.pipeline.data.vocab import train_vocab
    from aiayn.pipeline.evaluation.evaluate import evaluate_run
    from aiayn.pipeline.training.train import train

    reverse = tmp_path / "en-zh.tsv"
    reverse.write_text("".join(f"{e}\t{z}\n" for z, e in zh_en_pairs()), encoding="utf-8")
    cfg = _config(tmp_path, f"data.corpus={reverse}", "data.source_lang=en",
                  "data.target_lang=zh", "data.vocab_model_type=char", "data.vocab_size=100",
                  "train.steps=60")
    prepare_data(cfg)
    spm_path = train_vocab(cfg)
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(spm_path))
    assert processor.encode("我爱你", out_type=str) == ["▁", "我", "爱", "你"]  # one per character
    summary = train(cfg)
    # Checkpoint choice scored dev with the target language's tokenizer.
    dev = summary["averaging"]["candidates"]["last"]
    assert "tok:zh" in dev["bleu_signature"]
    report = evaluate_run(cfg, split="test")
    assert "tok:zh" in report["bleu_signature"] and report["bleu_tokenize"] == "zh"
    hypotheses = open(report["hypotheses_path"], encoding="utf-8").read().splitlines()
    references = [line.split("\t")[1] for line in
                  (tmp_path / "data" / "test.tsv").read_text(encoding="utf-8").splitlines()]
    assert report["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(hypotheses, [references], tokenize="zh").score, abs=0.01)
    # Each Chinese character is a token (13a would count each sentence as one "word").
    assert f"ref_len = {sum(len(r) for r in references)}" in report["bleu_detail"]
    assert f"ref_len = {len(references)}" in str(sacrebleu.corpus_bleu(hypotheses,
                                                                       [references]))
    saved = json.loads((tmp_path / "run" / "eval" / "test.json").read_text(encoding="utf-8"))
    assert saved["bleu_signature"] == report["bleu_signature"]
