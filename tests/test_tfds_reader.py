"""The TFDS reader against a real TFDS dataset, built on disk here from data the test writes.

``AiaynToyTranslate`` is a ``tfds.core.GeneratorBasedBuilder`` shaped like TFDS's WMT datasets
(``wmt19_translate/zh-en``: a ``zh-en`` config, a ``Translation`` feature keyed by language
code, train / validation / test splits). Its data comes from a TSV the test writes: nothing is
downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

tfds = pytest.importorskip("tensorflow_datasets")  # in the dev extras (CI installs them)

from aiayn.pipeline.config import load_config  # noqa: E402
from aiayn.pipeline.data import corpus, readers  # noqa: E402
from aiayn.pipeline.data.readers import CorpusError  # noqa: E402

NAME = "aiayn_toy_translate/zh-en"
SPLIT_PAIRS = {
    "train": [("我爱你", "I love you."), ("你好", "Hello."), ("今天天气很好", "The weather is "
              "very nice today."), ("谢谢", "Thank you very much."), ("我是学生。", "I am a "
              "student."), ("好久不见", "Long time no see."), ("你好", "In the beginning God "
              "created the heavens and the earth.")],  # the last one is misaligned
    "validation": [("晚上好", "Good evening."), ("早上好", "Good morning.")],
    "test": [("我们爱你们", "We love you."), ("再见", "Goodbye.")],
}


class AiaynToyTranslate(tfds.core.GeneratorBasedBuilder):
    """A translation dataset like wmt19_translate/zh-en, generated from ``SOURCE_DIR/<split>.tsv``.
    """

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="zh-en", description="Chinese-English")]
    SOURCE_DIR: Path | None = None  # set by the test before download_and_prepare()

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.Translation(languages=("zh", "en")),
            supervised_keys=("zh", "en"))

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(self.SOURCE_DIR / f"{split}.tsv")
                for split in SPLIT_PAIRS}

    def _generate_examples(self, path):
        for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
            zh, en = line.split("\t")
            yield i, {"zh": zh, "en": en}


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """A TFDS data directory holding the prepared aiayn_toy_translate/zh-en."""
    source = tmp_path_factory.mktemp("tfds_source")
    for split, pairs in SPLIT_PAIRS.items():
        (source / f"{split}.tsv").write_text("".join(f"{z}\t{e}\n" for z, e in pairs),
                                             encoding="utf-8")
    data_dir = tmp_path_factory.mktemp("tensorflow_datasets")
    AiaynToyTranslate.SOURCE_DIR = source
    builder = tfds.builder(NAME, data_dir=str(data_dir))
    builder.download_and_prepare()
    assert builder.is_prepared()
    return data_dir


@pytest.fixture
def env(tfds_dir, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tfds_dir))
    return tfds_dir


def test_reads_each_split_of_a_prepared_dataset(env):
    skip = readers.Drops("skip")
    train = readers.read_corpus(f"tfds:{NAME}", source_lang="zh", target_lang="en", drops=skip,
                                max_length_ratio=3.0)
    assert sorted(train) == sorted(SPLIT_PAIRS["train"][:-1])  # TFDS shuffles; same pairs
    assert dict(skip.counts) == {"length_ratio": 1}
    assert "tfds:aiayn_toy_translate/zh-en@train: example" in skip.examples["length_ratio"]
    for split in ("validation", "test"):
        pairs = readers.read_corpus(f"tfds:{NAME}@{split}", source_lang="zh", target_lang="en")
        assert sorted(pairs) == sorted(SPLIT_PAIRS[split])
    # The reverse direction: the same dataset, languages swapped.
    reverse = readers.read_corpus(f"tfds:{NAME}@test", source_lang="en", target_lang="zh")
    assert sorted(reverse) == sorted((e, z) for z, e in SPLIT_PAIRS["test"])
    # A TFDS slice of a split.
    assert len(readers.read_corpus(f"tfds:{NAME}@train[:3]", source_lang="zh",
                                   target_lang="en", max_length_ratio=0)) == 3


def test_errors_name_the_dataset_and_the_fix(env, tmp_path, monkeypatch):
    with pytest.raises(CorpusError, match=r"has no split 'dev'; splits: \['test', 'train', "
                                          r"'validation'\]"):
        readers.read_corpus(f"tfds:{NAME}@dev", source_lang="zh", target_lang="en")
    with pytest.raises(CorpusError, match=r"has no feature 'de' \(features: \['zh', 'en'\]\)"
                                          r".*data\.source_lang"):
        readers.read_corpus(f"tfds:{NAME}", source_lang="de", target_lang="en")
    with pytest.raises(CorpusError, match=r"absurd length ratio"):  # error mode stops
        readers.read_corpus(f"tfds:{NAME}", source_lang="zh", target_lang="en",
                            max_length_ratio=3.0)
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "empty"))
    with pytest.raises(CorpusError, match=r"is not prepared in .*empty.*never downloads"):
        readers.read_corpus(f"tfds:{NAME}", source_lang="zh", target_lang="en")


def test_prepare_data_from_tfds_splits(env, tmp_path):
    cfg = load_config(["tiny"], [f"data.corpus=tfds:{NAME}",
                                 f"data.dev_corpus=tfds:{NAME}@validation",
                                 f"data.test_corpus=tfds:{NAME}@test",
                                 "data.source_lang=zh", "data.target_lang=en",
                                 "data.on_error=skip", f"data.data_dir={tmp_path / 'zh_en'}"])
    report = corpus.prepare_data(cfg)
    assert report["source"]["format"] == "tfds"
    assert [report["splits"][s]["pairs"] for s in corpus.SPLITS] == [6, 2, 2]
    assert report["dropped"] == {"length_ratio": 1}
    assert sorted(corpus.read_tsv_pairs(corpus.split_path(cfg, "dev"))) == sorted(
        SPLIT_PAIRS["validation"])
