"""Readers, bad-input handling and prepare_data for user corpora (no network, no mod2imp)."""

import json

import pytest

from aiayn.pipeline.config import load_config
from aiayn.pipeline.data import corpus, readers
from aiayn.pipeline.data.readers import CorpusError, Drops


def _cfg(tmp_path, **data):
    overrides = [f"data.data_dir={tmp_path / 'prepared'}"] + [f"data.{k}={v}" for k, v in
                                                              data.items()]
    return load_config(["tiny"], overrides)


def _write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path


GOOD = [(f"the house number {i}", f"la casa número {i}") for i in range(20)]


def _tsv(tmp_path, pairs=GOOD, name="c.tsv"):
    return _write(tmp_path / name, "".join(f"{s}\t{t}\n" for s, t in pairs))


# --- TSV ---------------------------------------------------------------------------------------

def test_tsv_reads_and_normalises_whitespace(tmp_path):
    path = _write(tmp_path / "a.tsv", "  Hello   world \t Hola\u00a0 mundo\r\nA b\tC  d\n")
    assert readers.read_tsv(path) == [("Hello world", "Hola mundo"), ("A b", "C d")]


@pytest.mark.parametrize("line,found", [("no tab here", 0), ("a\tb\tc", 2)])
def test_tsv_line_without_exactly_one_tab(tmp_path, line, found):
    path = _write(tmp_path / "a.tsv", f"x\ty\n{line}\n")
    with pytest.raises(CorpusError, match=rf"a\.tsv:2: expected exactly one tab .* found {found}"
                                          r".*data\.on_error=skip"):
        readers.read_tsv(path)


def test_tsv_invalid_utf8_names_line_and_byte(tmp_path):
    path = _write(tmp_path / "a.tsv", b"ok\tbien\nbad \xff byte\tmal\n")
    with pytest.raises(CorpusError, match=r"a\.tsv:2: invalid UTF-8 .* byte 4 of the line "
                                          r"\(byte offset 12 in the file\).*iconv"):
        readers.read_tsv(path)


def test_tsv_empty_side(tmp_path):
    path = _write(tmp_path / "a.tsv", "ok\tbien\nonly source\t   \n")
    with pytest.raises(CorpusError, match=r"a\.tsv:2: the target side is empty"):
        readers.read_tsv(path)


def test_absurd_length_ratio(tmp_path):
    path = _write(tmp_path / "a.tsv", f"short\t{'a much longer side ' * 5}\n")
    with pytest.raises(CorpusError, match=r"a\.tsv:1: absurd length ratio: source has 5 "
                                          r"characters.*data\.max_length_ratio=3"):
        readers.read_tsv(path, max_length_ratio=3.0)
    # Short pairs are never flagged.
    assert readers.read_tsv(_write(tmp_path / "b.tsv", "Amen.\tAsí sea.\n"), max_length_ratio=1.1)


def test_skip_mode_counts_every_drop_by_reason(tmp_path):
    path = _write(tmp_path / "a.tsv", b"good one\tbuena\nno tab\n\xff\tx\n\tempty\n"
                                      b"x\t" + b"y" * 100 + b"\nlast\tultima\n")
    drops = Drops("skip")
    pairs = readers.read_tsv(path, drops, max_length_ratio=3.0)
    assert pairs == [("good one", "buena"), ("last", "ultima")]
    assert dict(drops.counts) == {"bad_tsv_line": 1, "invalid_utf8": 1, "empty_side": 1,
                                  "length_ratio": 1}
    assert "a.tsv:2" in drops.examples["bad_tsv_line"]


def test_missing_file(tmp_path):
    with pytest.raises(CorpusError, match=r"does not exist"):
        readers.read_tsv(tmp_path / "nope.tsv")


# --- byte order mark ---------------------------------------------------------------------------

BOM = "\ufeff"


def test_bom_is_not_part_of_the_first_sentence(tmp_path):
    path = _write(tmp_path / "a.tsv", f"{BOM}Hello\tHola\nBye\tAdiós\n")
    assert readers.read_tsv(path) == [("Hello", "Hola"), ("Bye", "Adiós")]
    assert readers.read_corpus(str(path)) == [("Hello", "Hola"), ("Bye", "Adiós")]
    # The prepared-split reader too (a hand-edited train.tsv).
    assert corpus.read_tsv_pairs(path)[0] == ("Hello", "Hola")
    # Line-aligned files: each may start with one.
    _write(tmp_path / "t.en", f"{BOM}one\ntwo\n")
    _write(tmp_path / "t.es", f"{BOM}uno\ndos\n")
    assert readers.read_corpus(str(tmp_path / "t")) == [("one", "uno"), ("two", "dos")]
    # Only a leading one: U+FEFF elsewhere is text (and byte offsets still count the mark).
    path = _write(tmp_path / "b.tsv", f"{BOM}ok\tbien\n".encode() + b"bad \xff\tmal\n")
    with pytest.raises(CorpusError, match=r"b\.tsv:2: invalid UTF-8 .* byte 4 of the line "
                                          r"\(byte offset 15 in the file\)"):
        readers.read_tsv(path)


def test_bom_is_not_part_of_the_vocabulary_input(tmp_path):
    from aiayn.pipeline.data import vocab

    path = _write(tmp_path / "train.tsv", f"{BOM}Hello\tHola\n")
    assert list(vocab._sentences(path)) == ["Hello", "Hola"]


def test_prepare_data_drops_the_bom(tmp_path):
    pairs = [(f"{BOM}{GOOD[0][0]}", GOOD[0][1])] + GOOD[1:]
    cfg = _cfg(tmp_path, corpus=_tsv(tmp_path, pairs), heldout_size=2)
    corpus.prepare_data(cfg)
    text = "".join(corpus.split_path(cfg, s).read_text(encoding="utf-8") for s in corpus.SPLITS)
    assert BOM not in text and GOOD[0][0] in text


# --- a directory where a file is expected ------------------------------------------------------

def test_directory_given_as_tsv_says_a_file_was_expected(tmp_path):
    folder = tmp_path / "corpus.tsv"
    folder.mkdir()
    _write(folder / "notes.txt", "hello\n")
    message = (r"'.*corpus\.tsv' is a directory, but a file was expected .*Give the file's path"
               r".*this one holds none")
    with pytest.raises(CorpusError, match=message):
        readers.read_tsv(folder)
    with pytest.raises(CorpusError, match=message):  # auto: no longer read as TFRecord
        readers.read_corpus(str(folder))
    with pytest.raises(CorpusError, match=message):
        readers.detect_format(str(folder))
    with pytest.raises(CorpusError, match=message):  # the prepared-split reader
        corpus.read_tsv_pairs(folder)
    with pytest.raises(CorpusError, match=message):  # and the data stage
        corpus.prepare_data(_cfg(tmp_path, corpus=folder))


def test_directory_of_tfrecord_shards_given_as_tsv_names_the_pattern(tmp_path):
    shards = tmp_path / "Split-train"
    shards.mkdir()
    for i in range(2):
        _write_tfrecord(shards / f"data_tfrecord-0000{i}-of-00002.gz", GOOD[:2], True)
    with pytest.raises(CorpusError, match=r"is a directory, but a file was expected.*holds 2 "
                                          r"TFRecord file\(s\): .*data\.format=tfrecord.*"
                                          rf"data\.corpus='{shards}/\*\.gz'"):
        readers.read_corpus(str(shards), "tsv")
    # Given as what it is, it still reads.
    assert readers.detect_format(str(shards)) == "tfrecord"
    assert readers.read_corpus(str(shards)) == GOOD[:2] * 2


def test_directory_as_a_line_aligned_file(tmp_path):
    (tmp_path / "train.en").mkdir()
    _write(tmp_path / "train.es", "uno\n")
    with pytest.raises(CorpusError, match=r"Source file '.*train\.en' is a directory, but a file "
                                          r"was expected"):
        readers.read_corpus(str(tmp_path / "train"))


def test_tfrecord_files_are_recognised_by_content(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    _write_tfrecord(folder / "part-0", GOOD[:3], False)  # no telling name, not compressed
    _write(folder / "README", "these are shards\n")
    assert readers.tfrecord_files(folder) == [folder / "part-0"]
    assert readers.read_corpus(str(folder / "part-0"), "tfrecord") == GOOD[:3]


# --- line-aligned files ------------------------------------------------------------------------

def test_text_pair_by_prefix_and_by_two_paths(tmp_path):
    _write(tmp_path / "train.en", "one\ntwo\n")
    _write(tmp_path / "train.es", "uno\ndos\n")
    expected = [("one", "uno"), ("two", "dos")]
    assert readers.read_corpus(str(tmp_path / "train")) == expected
    spec = f"{tmp_path / 'train.en'},{tmp_path / 'train.es'}"
    assert readers.detect_format(spec) == "text"
    assert readers.read_corpus(spec) == expected


def test_text_pair_different_line_counts_is_an_error_even_when_skipping(tmp_path):
    src = _write(tmp_path / "train.en", "one\ntwo\nthree\n")
    tgt = _write(tmp_path / "train.es", "uno\ndos\n")
    with pytest.raises(CorpusError, match=r"train\.en has 3 lines, .*train\.es has 2"):
        readers.read_text_pair(src, tgt, Drops("skip"))


def test_text_pair_bad_lines(tmp_path):
    src = _write(tmp_path / "t.en", b"one\n\ntwo\n")
    tgt = _write(tmp_path / "t.es", b"uno\nvacio\nd\xe9s\n")
    with pytest.raises(CorpusError, match=r"t\.en:2 / .*t\.es:2: the source side is empty"):
        readers.read_text_pair(src, tgt)
    drops = Drops("skip")
    assert readers.read_text_pair(src, tgt, drops) == [("one", "uno")]
    assert dict(drops.counts) == {"empty_side": 1, "invalid_utf8": 1}
    assert "t.es:3" in drops.examples["invalid_utf8"]


# --- TFRecord ----------------------------------------------------------------------------------

def _write_tfrecord(path, pairs, gzip, extra=None):
    import tensorflow as tf

    options = tf.io.TFRecordOptions(compression_type="GZIP" if gzip else "")
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for s, t in pairs:
            feats = {"source": s, "target": t} if extra is None else extra
            example = tf.train.Example(features=tf.train.Features(feature={
                k: tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[v if isinstance(v, bytes) else v.encode()]))
                for k, v in feats.items()}))
            writer.write(example.SerializeToString())
    return path


@pytest.mark.parametrize("gzip", [False, True])
def test_tfrecord_plain_and_gzip(tmp_path, gzip):
    split_dir = tmp_path / "Split-train"
    split_dir.mkdir()
    name = "data_tfrecord-00000-of-00001" + (".gz" if gzip else "")
    _write_tfrecord(split_dir / name, GOOD[:3], gzip)
    assert readers.detect_format(str(split_dir)) == "tfrecord"
    assert readers.read_corpus(str(split_dir)) == GOOD[:3]
    assert readers.read_corpus(str(split_dir / name)) == GOOD[:3]


def test_tfrecord_missing_feature_and_bad_utf8(tmp_path):
    path = _write_tfrecord(tmp_path / "x.tfrecord", [("a", "b")], False,
                           extra={"src": "a", "tgt": "b"})
    with pytest.raises(CorpusError, match=r"x\.tfrecord: record 1: no bytes feature 'source' "
                                          r"\(features present: \['src', 'tgt'\]\)"):
        readers.read_tfrecord(str(path))
    path = _write_tfrecord(tmp_path / "y.tfrecord", [(b"ok\xff", b"bien")], True)
    with pytest.raises(CorpusError, match=r"y\.tfrecord: record 1: invalid UTF-8 in the "
                                          r"'source' feature at byte 2"):
        readers.read_tfrecord(str(path))


def test_tfds_without_package_or_data_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusError, match=r"tensorflow.datasets|not prepared|TFDS dataset"):
        readers.read_corpus("tfds:definitely_not_a_dataset_xyz")


def test_unknown_corpus_path(tmp_path):
    with pytest.raises(CorpusError, match=r"not found .*prefix of line-aligned files"):
        readers.detect_format(str(tmp_path / "nothing"))


# --- prepare_data ------------------------------------------------------------------------------

def test_prepare_data_heldout_split_report_and_reuse(tmp_path):
    pairs = GOOD + [("bad", "x" * 200)]
    cfg = _cfg(tmp_path, corpus=_tsv(tmp_path, pairs), heldout_size=3, on_error="skip")
    report = corpus.prepare_data(cfg)
    splits = {s: corpus.read_tsv_pairs(corpus.split_path(cfg, s)) for s in corpus.SPLITS}
    assert [len(splits[s]) for s in corpus.SPLITS] == [14, 3, 3]
    assert set(splits["dev"]).isdisjoint(splits["test"])
    assert set(splits["train"]).isdisjoint(splits["dev"] + splits["test"])
    assert sorted(sum(splits.values(), [])) == sorted(GOOD)
    assert report["dropped"] == {"length_ratio": 1}
    assert report["kept"] == 20
    on_disk = json.loads((tmp_path / "prepared" / "data_report.json").read_text())
    for s in corpus.SPLITS:
        assert on_disk["splits"][s]["pairs"] == len(splits[s])
        assert on_disk["splits"][s]["sha256"] == corpus.sha256_file(corpus.split_path(cfg, s))
    assert not list((tmp_path / "prepared").glob(".*tmp"))
    assert corpus.prepare_data(cfg)["reused"] is True
    # Same seed, same split; a changed config rebuilds.
    cfg2 = _cfg(tmp_path, corpus=cfg.data.corpus, heldout_size=2, on_error="skip")
    assert corpus.prepare_data(cfg2)["reused"] is False
    assert len(corpus.read_tsv_pairs(corpus.split_path(cfg2, "dev"))) == 2


def test_prepare_data_with_given_dev_and_test(tmp_path):
    cfg = _cfg(tmp_path, corpus=_tsv(tmp_path), dev_corpus=_tsv(tmp_path, GOOD[:2], "d.tsv"),
               test_corpus=_tsv(tmp_path, GOOD[2:5], "t.tsv"))
    report = corpus.prepare_data(cfg)
    assert [report["splits"][s]["pairs"] for s in corpus.SPLITS] == [20, 2, 3]


def test_prepare_data_errors(tmp_path):
    cfg = _cfg(tmp_path, corpus=_tsv(tmp_path, GOOD[:4]), heldout_size=3)
    with pytest.raises(CorpusError, match=r"has 4 usable pairs.*Lower data\.heldout_size"):
        corpus.prepare_data(cfg)
    bad = _write(tmp_path / "bad.tsv", "a\tb\nno tab\n")
    with pytest.raises(CorpusError, match=r"bad\.tsv:2: expected exactly one tab"):
        corpus.prepare_data(_cfg(tmp_path, corpus=bad, heldout_size=1))


def test_split_path(tmp_path):
    cfg = _cfg(tmp_path)
    assert corpus.split_path(cfg, "dev") == tmp_path / "prepared" / "dev.tsv"
    with pytest.raises(ValueError, match="split must be one of"):
        corpus.split_path(cfg, "valid")
