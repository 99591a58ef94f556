"""`aiayn data` and `aiayn vocab`: the data stage's commands (thin calls into the library).

Handlers import the library lazily so that ``aiayn --help`` answers without loading TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable


def _cmd_data(args, cfg):
    from aiayn.pipeline.data.corpus import prepare_data

    return prepare_data(cfg)


def _cmd_vocab(args, cfg):
    from aiayn.pipeline.data.vocab import train_vocab

    return str(train_vocab(cfg))


COMMANDS: dict[str, tuple[str, Callable, Callable | None]] = {
    "data": ("Build the parallel corpus: train/dev/test TSV and a data report.", _cmd_data, None),
    "vocab": ("Train the joint SentencePiece vocabulary on the training split.", _cmd_vocab, None),
}
