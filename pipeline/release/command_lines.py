"""The `aiayn` command lines that messages tell a user to run, with the run's own presets.

    aiayn_command(cfg, "translate", "int8", ["--engine", "ctranslate2", "I love you."])
    # -> "aiayn translate --preset small --engine ctranslate2 'I love you.' --quantization int8"

Light on purpose (no TensorFlow): `aiayn translate --engine ctranslate2` builds its hints from
here and starts without loading TensorFlow.
"""

from __future__ import annotations

import shlex

from aiayn.pipeline.config import Config


def aiayn_command(cfg: Config, command: str, quantization: str, extra: list[str]) -> str:
    """``aiayn <command> --preset ... <extra> [--quantization q]``, shell-quoted."""
    words = ["aiayn", command] + [w for p in cfg.preset.split("+") if p for w in ("--preset", p)]
    words += extra + ([] if quantization == "none" else ["--quantization", quantization])
    return " ".join(shlex.quote(w) for w in words)
