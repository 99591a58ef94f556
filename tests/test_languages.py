"""Any language pair: the length-ratio check across scripts, character coverage by language."""

import json

import pytest

from aiayn.pipeline.config import load_config
from aiayn.pipeline.data import corpus, languages, readers
from aiayn.pipeline.data.readers import CorpusError, Drops

# Real translations between CJK and Latin scripts (short, as in a phrase book or subtitles).
REAL_PAIRS = [
    ("今天天气很好", "The weather is very nice today."),
    ("我爱你", "I love you."),
    ("你好", "Hello."),
    ("谢谢", "Thank you very much."),
    ("我不知道他在哪里。", "I don't know where he is."),
    ("请问，去火车站怎么走？", "Excuse me, how do I get to the train station?"),
    ("这本书是我昨天在图书馆借的。", "I borrowed this book from the library yesterday."),
    ("他每天早上六点起床。", "He gets up at six o'clock every morning."),
    ("中华人民共和国", "The People's Republic of China"),
    ("对不起，我迟到了。", "Sorry, I'm late."),
    ("请给我一杯咖啡。", "A cup of coffee, please."),
    ("好久不见", "Long time no see."),
    ("日本語のテキスト", "Japanese text"),
    ("ありがとうございます", "Thank you very much."),
    ("東京は日本の首都です。", "Tokyo is the capital of Japan."),
    ("사랑해요", "I love you."),
    ("한국어를 공부하고 있어요.", "I am studying Korean."),
    ("我爱你", "Te quiero."),
]
# Misaligned pairs, in both directions.
MISALIGNED = [
    ("你好", "In the beginning God created the heavens and the earth."),
    ("我爱你", "The weather will be very nice today, and tomorrow it will rain in the north."),
    ("这本书是我昨天在图书馆借的，我非常喜欢它，我打算明天再去借一本。", "Yes, it is."),
]


def test_weighted_length_counts_latin_letter_equivalents():
    assert languages.weighted_length("I love you") == 10.0  # Latin: plain characters
    assert languages.weighted_length("Así sea.") == len("Así sea.")
    assert languages.weighted_length("我爱你") == 3 * 3.5  # Han
    assert languages.weighted_length("ありがとう") == 5 * 2.0  # Kana
    assert languages.weighted_length("사랑해요") == 4 * 2.5  # Hangul
    assert languages.weighted_length("我，你") == 2 * 3.5 + 1  # CJK punctuation counts 1
    assert languages.weighted_length("𠀀") == 3.5  # CJK Extension B, beyond the BMP


def test_real_cjk_latin_pairs_pass_the_default_ratio():
    ratio = load_config(["tiny"]).data.max_length_ratio
    drops = Drops("error")  # any drop would raise
    for source, target in REAL_PAIRS:
        assert readers.check_pair(source, target, "pair", drops, ratio) == (source, target)
        assert readers.check_pair(target, source, "pair", drops, ratio) == (target, source)
    # What the issue saw: counted in raw characters, several are "absurd" at the default 3.0.
    raw = [max(len(s), len(t)) / min(len(s), len(t)) for s, t in REAL_PAIRS]
    assert sum(r > ratio for r in raw) >= 8


@pytest.mark.parametrize("source,target", MISALIGNED)
def test_misaligned_pairs_across_scripts_are_still_caught(source, target):
    with pytest.raises(CorpusError, match=r"pair: absurd length ratio: source has \d+ characters "
                                          r"\([\d.]+ weighted by script\)"):
        readers.check_pair(source, target, "pair", Drops("error"), 3.0)


def test_prepare_data_keeps_real_pairs_and_counts_every_drop(tmp_path):
    lines = [f"{s}\t{t}\n" for s, t in REAL_PAIRS + MISALIGNED] + ["只有一边\t\n"]
    path = tmp_path / "zh-en.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    cfg = load_config(["tiny"], [f"data.corpus={path}", f"data.data_dir={tmp_path / 'out'}",
                                 "data.source_lang=zh", "data.target_lang=en",
                                 "data.heldout_size=2", "data.on_error=skip"])
    report = corpus.prepare_data(cfg)
    assert report["kept"] == len(REAL_PAIRS)
    assert report["dropped"] == {"length_ratio": len(MISALIGNED), "empty_side": 1}
    assert report["kept"] + sum(report["dropped"].values()) == len(lines)  # every line counted
    assert "weighted by script" in report["length_unit"]
    on_disk = json.loads((tmp_path / "out" / "data_report.json").read_text(encoding="utf-8"))
    assert on_disk["splits"]["train"]["dropped"] == report["dropped"]
    kept = sum((corpus.read_tsv_pairs(corpus.split_path(cfg, s)) for s in corpus.SPLITS), [])
    assert sorted(kept) == sorted(REAL_PAIRS)


@pytest.mark.parametrize("source,target,coverage", [
    ("en", "es", 1.0), ("zh", "en", 0.9995), ("en", "zh-Hant", 0.9995), ("ja_JP", "en", 0.9995),
    ("ko", "en", 0.9995), ("ru", "en", 1.0),
])
def test_character_coverage_by_language(source, target, coverage):
    from aiayn.pipeline.data.vocab import character_coverage

    assert languages.default_character_coverage(source, target) == coverage
    cfg = load_config(["tiny"], ["data.corpus=c.tsv", f"data.source_lang={source}",
                                 f"data.target_lang={target}"])
    assert character_coverage(cfg) == coverage
    explicit = load_config(["tiny"], ["data.corpus=c.tsv", f"data.source_lang={source}",
                                      f"data.target_lang={target}",
                                      "data.character_coverage=0.999"])
    assert character_coverage(explicit) == 0.999  # a set value wins


def test_base_language():
    assert [languages.base_language(c) for c in ("zh-Hant-TW", "ZH", "ja_JP", "sr@latin", "en")
            ] == ["zh", "zh", "ja", "sr", "en"]
