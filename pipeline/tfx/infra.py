"""The infra check of the TFX pipeline: will the stock model server load and answer this model?

TFX's InfraValidator starts a ``tensorflow_model_server`` (a Docker image or a Kubernetes pod)
to answer that; this pipeline runs where neither may exist (a laptop, a chroot, a CI runner), so
its check (the ``InfraCheck`` component, pipeline/tfx/components.py) uses the project's verifier
instead, :func:`aiayn.export.verify.verify_export`, which loads the SavedModel in a FRESH
process that imports only TensorFlow and tensorflow-text (what the stock server links):

- every op of the graph is core TensorFlow or tensorflow-text, none a Python callback;
- ``serving_default`` and ``n_best`` have the served inputs and outputs;
- the warmup requests (``assets.extra/tf_serving_warmup_requests``) are replayed, each must
  answer with one row per input: TF Serving replays them before a version takes traffic, and a
  failing one stops the version loading;
- the stored sample sentences are translated and must equal the export-time translations.

The result is an ``InfraBlessing`` (``blessed`` 1 or 0, the reason, ``INFRA_BLESSED`` or
``INFRA_NOT_BLESSED`` and ``infra_check.json`` in its directory). This module imports no TFX.

Example::

    result = infra_check(".../Trainer/model/7/Format-Serving", ".../InfraCheck/blessing/10")
    result["blessed"], result["reason"]
"""

from __future__ import annotations

from typing import Any

from aiayn.pipeline.tfx import blessing
from aiayn.pipeline.tfx.evaluator import write_blessing_files


def _local_copy(model_dir: str, scratch: str) -> str:
    """The verifier reads local files: a ``gs://`` model is copied to ``scratch`` first."""
    if "://" not in model_dir:
        return model_dir
    import tensorflow as tf

    root = model_dir.rstrip("/")
    for parent, _, files in tf.io.gfile.walk(root):
        rel = parent[len(root):].lstrip("/")
        tf.io.gfile.makedirs(f"{scratch}/{rel}")
        for name in files:
            tf.io.gfile.copy(f"{parent}/{name}", f"{scratch}/{rel}/{name}", overwrite=True)
    return scratch


def infra_check(model_dir: str, output_dir: str, timeout: float = 600.0) -> dict[str, Any]:
    """Verifies ``model_dir`` in a fresh TensorFlow-only process and writes the infra blessing.

    Args:
      model_dir: the Trainer's serving SavedModel (``Format-Serving``; local or ``gs://``).
      output_dir: the InfraBlessing artifact's directory.
      timeout: seconds allowed for the fresh process.

    Returns:
      ``blessed``, ``reason``, ``problems``, ``warmup_requests`` (replayed), ``samples``
      (sentences answered), ``signatures`` and ``op_types_by_origin``, as written to
      ``infra_check.json``.
    """
    import tempfile

    from aiayn.export.verify import VerificationError, verify_export

    result: dict[str, Any] = {"model": model_dir, "warmup_requests": 0, "samples": 0,
                              "signatures": [], "op_types_by_origin": {}}
    with tempfile.TemporaryDirectory(prefix="aiayn-tfx-infra-") as scratch:
        try:
            report = verify_export(_local_copy(model_dir, scratch), replay_warmup=True,
                                   timeout=timeout)
        except (VerificationError, OSError) as err:  # cannot load or run at all
            lines = [line for line in str(err).strip().splitlines() if line.strip()]
            problems = [f"{lines[0]} {lines[-1].strip()}" if len(lines) > 1 else str(err)]
        else:
            problems = list(report.problems)
            summary = report.summary()
            result.update(warmup_requests=report.warmup_requests, samples=len(report.texts),
                          signatures=summary["signatures"],
                          op_types_by_origin=summary["op_types_by_origin"])
    blessed = not problems
    if blessed:
        reason = (f"infra blessed: loads in a fresh TensorFlow + tensorflow-text process, stock "
                  f"ops only; {result['warmup_requests']} warmup requests replayed; "
                  f"{result['samples']} sample sentences answered as at export")
    else:
        reason = f"infra not blessed: {problems[0]}" + (
            f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else "")
    result.update(blessed=blessed, reason=reason, problems=problems)
    write_blessing_files(output_dir, blessed, result, blessing.INFRA_BLESSING_FILES,
                         blessing.INFRA_FILE)
    print(f"InfraCheck: {reason}", flush=True)
    return result
