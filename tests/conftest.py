"""Shared fixtures: a toy parallel corpus and a tiny SentencePiece model trained from it.

TensorFlow is imported inside the fixtures that need it, so tests that do not use them start fast.

Fixtures (session-scoped, built once):
  toy_pairs        list of (english, spanish) pairs, incl. CJK (我爱你) and full-width forms.
  toy_data_dir     a data dir holding train.tsv / dev.tsv / test.tsv of `toy_pairs`.
  toy_config       the `tiny` preset pointed at `toy_data_dir` (vocab_size 200, a soft limit).
  spm_model_path   `<toy_data_dir>/spm.model`, trained with `aiayn.pipeline.data.vocab.train_vocab`.
  toy_tokenizer    an `aiayn.models.tokenizer.SubwordTokenizer` of that model.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TOY_PAIRS = [
    ("In the beginning God created the heavens and the earth.",
     "En el principio creó Dios los cielos y la tierra."),
    ("The earth was formless and empty.", "Y la tierra estaba desordenada y vacía."),
    ("God said, Let there be light, and there was light.",
     "Y dijo Dios: Sea la luz, y fue la luz."),
    ("God saw the light, and saw that it was good.", "Y vio Dios que la luz era buena."),
    ("There was evening and there was morning, the first day.",
     "Y fue la tarde y la mañana un día."),
    ("I love you.", "Te amo."),
    ("We love you, my friend.", "Te amamos, amigo mío."),
    ("Where is the house of my father?", "¿Dónde está la casa de mi padre?"),
    ("The son of man came to serve.", "El hijo del hombre vino a servir."),
    ("Jesus wept.", "Jesús lloró."),
    ("Blessed are the peacemakers, for they shall be called children of God.",
     "Bienaventurados los pacificadores, porque ellos serán llamados hijos de Dios."),
    ("Love your neighbour as yourself.", "Amarás a tu prójimo como a ti mismo."),
    ("The Lord is my shepherd; I shall not want.", "El Señor es mi pastor; nada me faltará."),
    ("Seven days and seven nights.", "Siete días y siete noches."),
    ("He went up into the mountain to pray.", "Subió al monte a orar."),
    ("The people were amazed at his teaching.", "La gente se admiraba de su doctrina."),
    ("And the word was with God.", "Y el verbo era con Dios."),
    ("Peace be with you.", "La paz sea con vosotros."),
    ("Full-width ＡＢＣ １２３ letters are normalised.", "Las letras ＡＢＣ １２３ se normalizan."),
    ("The king of Israel sat on his throne.", "El rey de Israel se sentó en su trono."),
    ("They came to the river and crossed over.", "Llegaron al río y lo cruzaron."),
    ("Give us today our daily bread.", "Danos hoy nuestro pan de cada día."),
    ("The sea and all that is in it.", "El mar y todo lo que hay en él."),
    ("My soul waits for the Lord.", "Mi alma espera al Señor."),
    ("我爱你", "我爱你"),
    ("你好，世界", "你好，世界"),
    ("今天天气很好", "今天天气很好"),
    ("我们爱你们", "我们爱你们"),
    ("日本語のテキスト", "日本語のテキスト"),
]


@pytest.fixture(scope="session")
def toy_pairs():
    return list(TOY_PAIRS)


@pytest.fixture(scope="session")
def toy_data_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("toy_data")
    for split in ("train", "dev", "test"):
        with open(data_dir / f"{split}.tsv", "w", encoding="utf-8") as f:
            for source, target in TOY_PAIRS:
                f.write(f"{source}\t{target}\n")
    return data_dir


@pytest.fixture(scope="session")
def toy_config(toy_data_dir):
    from aiayn.pipeline.config import load_config

    return load_config(["tiny"], [f"data.data_dir={toy_data_dir}", "data.vocab_size=200"])


@pytest.fixture(scope="session")
def spm_model_path(toy_config):
    from aiayn.pipeline.data.vocab import train_vocab

    return train_vocab(toy_config)


@pytest.fixture(scope="session")
def toy_tokenizer(spm_model_path):
    from aiayn.models.tokenizer import SubwordTokenizer

    return SubwordTokenizer.from_file(spm_model_path)
