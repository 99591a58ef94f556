"""`aiayn train` and `aiayn average`: the training stage's commands (thin calls).

Handlers import the library lazily so that ``aiayn --help`` answers without loading TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable


def _cmd_train(args, cfg):
    from aiayn.pipeline.training.train import train

    return train(cfg)


def _cmd_average(args, cfg):
    from aiayn.pipeline.training.averaging import average_checkpoints_for_run

    return average_checkpoints_for_run(cfg)


COMMANDS: dict[str, tuple[str, Callable, Callable | None]] = {
    "train": ("Train the Transformer with model.fit (resumes after a crash).", _cmd_train, None),
    "average": ("Average the last N checkpoints of the run.", _cmd_average, None),
}
