"""Settings TensorFlow reads once, when it is first imported: set before that import.

    from aiayn.pipeline.tf_runtime import prepare_tensorflow
    prepare_tensorflow()  # first, then `import tensorflow`

``TF_ENABLE_ONEDNN_OPTS``: TensorFlow turns its oneDNN CPU kernels on by itself only on x86
CPUs with AVX-512 VNNI/BF16 or AMX; everywhere else (an AVX2-only CPU, such as the 2-core AMD
EPYC this project is measured on) Eigen runs the matmuls. There, oneDNN made training of the
``small`` preset 1.09x faster (``bench/train.py``) and beam search about 1.15x faster
(``bench/decode_profile.py``; figures in docs/RECIPE.md, "Throughput"), so the project turns it
on wherever the user has not chosen: ``TF_ENABLE_ONEDNN_OPTS=0`` keeps Eigen.
The exported SavedModel holds the same stock ops either way; oneDNN only changes which kernels
run them in this process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

ONEDNN = "TF_ENABLE_ONEDNN_OPTS"


def prepare_tensorflow(environ: MutableMapping[str, str] | None = None,
                       modules: Mapping[str, object] | None = None) -> bool:
    """Turns oneDNN on unless the user set ``TF_ENABLE_ONEDNN_OPTS`` or TensorFlow is loaded.

    Returns whether the setting can still take effect (TensorFlow not imported yet).
    """
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if "tensorflow" in modules:
        return False  # it has read its settings already; changing them now would only mislead
    environ.setdefault(ONEDNN, "1")
    return True


def onednn_setting(environ: Mapping[str, str] | None = None) -> str:
    """What this process asked TensorFlow for: ``on``, ``off`` or ``default`` (TF decides)."""
    value = (os.environ if environ is None else environ).get(ONEDNN, "").strip().lower()
    if value in ("1", "true"):  # what TensorFlow's boolean environment variables accept
        return "on"
    if value in ("0", "false"):
        return "off"
    return "default"
