"""Vocabulary training: settings from the config, model types, atomic write, clear errors."""

import json
import unicodedata

import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from aiayn.pipeline.config import load_config
from aiayn.pipeline.data.vocab import output_ids, train_vocab, vocab_path
from aiayn.pipeline.errors import UserInputError


def _config(data_dir, *overrides):
    return load_config(["tiny"], [f"data.data_dir={data_dir}", *overrides])


def _proto(path):
    proto = model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    return proto


def test_trained_model_settings(spm_model_path, toy_config):
    assert spm_model_path == vocab_path(toy_config)
    assert spm_model_path.name == "spm.model"
    proto = _proto(spm_model_path)
    assert proto.normalizer_spec.name == "nmt_nfkc"
    assert proto.trainer_spec.model_type == model_pb2.TrainerSpec.UNIGRAM
    assert (proto.trainer_spec.pad_id, proto.trainer_spec.unk_id, proto.trainer_spec.bos_id,
            proto.trainer_spec.eos_id) == (0, 1, 2, 3)
    # vocab_size is a soft limit: the toy corpus cannot fill 200 pieces with a unigram model.
    assert 0 < len(proto.pieces) <= 200
    assert not list(spm_model_path.parent.glob(".spm.model.*.tmp"))


def test_trains_on_both_sides(spm_model_path, toy_pairs):
    processor = spm.SentencePieceProcessor(model_file=str(spm_model_path))
    pieces = {processor.id_to_piece(i) for i in range(processor.get_piece_size())}
    # Characters only found on the Spanish side and on the English side are both covered.
    for char in ("ñ", "ó", "w", "k"):
        assert any(char in p for p in pieces), char


@pytest.mark.parametrize("model_type,size", [("unigram", 120), ("bpe", 120), ("char", 100),
                                             ("word", 400)])
def test_model_types_and_size(toy_data_dir, tmp_path, model_type, size):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "train.tsv").write_bytes((toy_data_dir / "train.tsv").read_bytes())
    cfg = _config(data_dir, f"data.vocab_model_type={model_type}", f"data.vocab_size={size}")
    path = train_vocab(cfg)
    proto = _proto(path)
    assert model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type).lower() == model_type
    assert len(proto.pieces) <= size
    processor = spm.SentencePieceProcessor(model_file=str(path))
    text = "God said, Let there be light."
    assert processor.decode(processor.encode(text)) == unicodedata.normalize("NFKC", text)


def test_missing_training_split_says_how_to_make_it(tmp_path):
    with pytest.raises(UserInputError, match=r"train\.tsv.*aiayn data.*make data"):
        train_vocab(_config(tmp_path))
    assert not (tmp_path / "spm.model").exists()


def test_bad_line_names_file_and_line(tmp_path):
    (tmp_path / "train.tsv").write_text("a\tb\nno tab here\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"train\.tsv:2: .*one tab"):
        train_vocab(_config(tmp_path))


def test_empty_split_is_an_error(tmp_path):
    (tmp_path / "train.tsv").write_text("", encoding="utf-8")
    with pytest.raises(UserInputError, match="no sentences"):
        train_vocab(_config(tmp_path))


def test_size_below_character_count_says_what_to_change(toy_data_dir, tmp_path):
    (tmp_path / "train.tsv").write_bytes((toy_data_dir / "train.tsv").read_bytes())
    with pytest.raises(UserInputError, match=r"raise `data\.vocab_size` to at least \d+"):
        train_vocab(_config(tmp_path, "data.vocab_size=20"))
    assert not (tmp_path / "spm.model").exists()


def test_deterministic(toy_data_dir, tmp_path):
    outputs = []
    for name in ("a", "b"):
        data_dir = tmp_path / name
        data_dir.mkdir()
        (data_dir / "train.tsv").write_bytes((toy_data_dir / "train.tsv").read_bytes())
        outputs.append(train_vocab(_config(data_dir, "data.vocab_size=150")).read_bytes())
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("langs,coverage", [(("en", "es"), 1.0), (("zh", "en"), 0.9995)])
def test_character_coverage_follows_the_languages(toy_data_dir, tmp_path, langs, coverage):
    (tmp_path / "train.tsv").write_bytes((toy_data_dir / "train.tsv").read_bytes())
    corpus = ["data.corpus=c.tsv"] if langs != ("en", "es") else []
    cfg = _config(tmp_path, *corpus, f"data.source_lang={langs[0]}",
                  f"data.target_lang={langs[1]}")
    assert cfg.data.character_coverage == 0  # the default: by language
    proto = _proto(train_vocab(cfg))
    assert proto.trainer_spec.character_coverage == pytest.approx(coverage)


def test_output_ids_are_the_specials_and_the_target_pieces_kept_until_the_data_changes(
        toy_data_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text((toy_data_dir / "train.tsv").read_text(encoding="utf-8"),
                                    encoding="utf-8")
    assert output_ids(_config(data)) is None  # joint, the paper: the whole vocabulary
    cfg = _config(data, "data.output_vocabulary=target")
    with pytest.raises(UserInputError, match=r"spm.model not found: build the vocabulary"):
        output_ids(cfg)
    train_vocab(cfg)
    processor = spm.SentencePieceProcessor(model_file=str(vocab_path(cfg)))
    targets = [line.split("\t")[1] for line in
               (data / "train.tsv").read_text(encoding="utf-8").splitlines() if line]
    expected = sorted({0, 1, 2, 3} | {i for t in targets for i in processor.encode(t)})
    ids = output_ids(cfg)
    assert ids == expected and len(ids) < processor.get_piece_size()
    kept = json.loads((data / "output_ids.json").read_text(encoding="utf-8"))
    assert (kept["ids"], kept["output_pieces"], kept["vocabulary_size"]) == (
        expected, len(expected), processor.get_piece_size())
    # Kept: the file is what is read while spm.model and train.tsv are unchanged.
    (data / "output_ids.json").write_text(json.dumps({**kept, "ids": [0, 1, 2, 3]}))
    assert output_ids(cfg) == [0, 1, 2, 3]
    (data / "train.tsv").write_text("Hello.\tHola.\n", encoding="utf-8")  # changed: read again
    assert output_ids(cfg) == sorted({0, 1, 2, 3, *processor.encode("Hola.")})
    (data / "train.tsv").unlink()  # no split: the kept ids, while spm.model matches
    assert output_ids(cfg) == sorted({0, 1, 2, 3, *processor.encode("Hola.")})
    (data / "output_ids.json").unlink()
    with pytest.raises(UserInputError, match=r"train.tsv, which is missing.*"
                                             r"`data.output_vocabulary=joint`"):
        output_ids(cfg)
