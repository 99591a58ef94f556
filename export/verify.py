"""Verifies an export the way the stock server will meet it: a clean process, stock ops only.

:func:`verify_export` starts a FRESH Python process that imports only ``tensorflow`` and
``tensorflow_text`` (never Keras or our code) and, in it:

1. reads ``saved_model.pb`` and walks every node of the graph and of its function library; each
   op must be registered by core TensorFlow or by tensorflow-text (both linked into the stock
   ``tensorflow_model_server``), and none may be a Python callback (``PyFunc``,
   ``PyFuncStateless``, ``EagerPyFunc``); anything else is a custom op the server lacks;
2. lists the signatures the way ``saved_model_cli show --all`` does;
3. loads the SavedModel, runs ``serving_default`` and ``n_best`` on the sample sentences;
4. with ``replay_warmup=True``, replays ``assets.extra/tf_serving_warmup_requests`` as TF Serving
   does before a version takes traffic (the parent parses the PredictionLogs; the child gets
   plain strings): each request must run and answer one row per input.

The parent compares those outputs with in-process translation: the outputs stored at export
time in ``assets.extra/verify_samples.json``, or ``expected`` outputs passed in.

Example::

    report = verify_export("exports/translate/3")
    print(report.signatures)
    report.raise_if_failed()
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiayn.export.saved_model import NBEST_SIGNATURE, SAMPLES_FILE, SERVING_SIGNATURE, WARMUP_FILE

# Python callbacks: they need the exporting Python process and do not exist in the server.
FORBIDDEN_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})

# Runs in the fresh process. Prints one JSON object on its last stdout line.
_CHILD = r'''
import json, sys
export_dir, texts_path = sys.argv[1], sys.argv[2]
warmup_path = sys.argv[3] if len(sys.argv) > 3 else ""
import tensorflow as tf
from tensorflow.core.framework import op_def_pb2
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.client import pywrap_tf_session as _session

def registered_ops():
    buf = _session.TF_GetAllOpList()
    ops = op_def_pb2.OpList()
    ops.ParseFromString(buf if isinstance(buf, bytes) else _session.TF_GetBuffer(buf))
    return {op.name for op in ops.op}

core = registered_ops()
import tensorflow_text  # noqa: F401  registers the text ops, as the stock server links them
text_ops = registered_ops() - core

sm = saved_model_pb2.SavedModel()
with open(export_dir + "/saved_model.pb", "rb") as f:
    sm.ParseFromString(f.read())
used = {}
def visit(nodes, where):
    for node in nodes:
        used.setdefault(node.op, set()).add(where)
for meta in sm.meta_graphs:
    visit(meta.graph_def.node, "graph")
    for fn in meta.graph_def.library.function:
        visit(fn.node_def, "function")
function_names = set()
for meta in sm.meta_graphs:
    function_names |= {f.signature.name for f in meta.graph_def.library.function}
ops = {}
for op, where in sorted(used.items()):
    if op in function_names:
        origin = "function-call"
    elif op in core:
        origin = "core"
    elif op in text_ops:
        origin = "tensorflow_text"
    else:
        origin = "unknown"
    ops[op] = origin

from tensorflow.core.framework import types_pb2

def dtype_name(enum):
    return types_pb2.DataType.Name(enum)

def shape_text(shape):
    if shape.unknown_rank:
        return "unknown_rank"
    dims = [d.size for d in shape.dim]
    if not dims:
        return "()"
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"

lines = ["MetaGraphDef with tag-set: '%s' contains the following SignatureDefs:" %
         ", ".join(sm.meta_graphs[0].meta_info_def.tags), ""]
signatures = {}
for key, sig in sorted(sm.meta_graphs[0].signature_def.items()):
    if key.startswith("__"):
        continue
    entry = {"inputs": {}, "outputs": {}, "method_name": sig.method_name}
    lines.append("signature_def['%s']:" % key)
    for kind, tensors in (("input", sig.inputs), ("output", sig.outputs)):
        lines.append("  The given SavedModel SignatureDef contains the following %s(s):" % kind)
        for name, info in sorted(tensors.items()):
            entry[kind + "s"][name] = {"dtype": dtype_name(info.dtype),
                                       "shape": [d.size for d in info.tensor_shape.dim]}
            lines += ["    %ss['%s'] tensor_info:" % (kind, name),
                      "        dtype: %s" % dtype_name(info.dtype),
                      "        shape: %s" % shape_text(info.tensor_shape),
                      "        name: %s" % info.name]
    lines.append("  Method name is: %s" % sig.method_name)
    lines.append("")
    signatures[key] = entry

texts = json.load(open(texts_path, encoding="utf-8"))
outputs = {}
bad = [op for op, origin in ops.items()
       if origin == "unknown" or op in ("PyFunc", "PyFuncStateless", "EagerPyFunc")]
# A graph with Python callbacks or unknown ops cannot run in the server: report, do not load.
loaded = None if bad else tf.saved_model.load(export_dir)
for key in ("serving_default", "n_best") if loaded is not None else ():
    fn = loaded.signatures[key]
    result = fn(text=tf.constant([t.encode("utf-8") for t in texts], tf.string))
    out = {}
    for name, value in result.items():
        value = value.numpy()
        if value.dtype == object:
            out[name] = [[b.decode("utf-8") for b in row] if value.ndim == 2
                         else row.decode("utf-8") for row in value.tolist()]
        else:
            out[name] = value.tolist()
    outputs[key] = out
# Warmup replay: {"signature", "inputs": {name: [base64 bytes]}} per request, in file order.
import base64
warmup = {"replayed": 0, "failures": []}
for number, req in enumerate(json.load(open(warmup_path)) if warmup_path and loaded is not None
                             else [], start=1):
    where = "warmup request %d (%s)" % (number, req["signature"])
    if req["signature"] not in loaded.signatures:
        warmup["failures"].append("%s: no such signature" % where)
        continue
    inputs = {k: tf.constant([base64.b64decode(v) for v in values], tf.string)
              for k, values in req["inputs"].items()}
    rows = min(len(v) for v in req["inputs"].values()) if req["inputs"] else 0
    try:
        result = loaded.signatures[req["signature"]](**inputs)
    except Exception as err:  # what the server would log before refusing the version
        warmup["failures"].append("%s: %s: %s" % (where, type(err).__name__,
                                                  (str(err).strip().splitlines() or [""])[0]))
        continue
    wrong = {k: int(v.shape[0]) for k, v in result.items() if int(v.shape[0]) != rows}
    if wrong:
        warmup["failures"].append("%s: %d inputs, outputs with other row counts %s"
                                  % (where, rows, wrong))
        continue
    warmup["replayed"] += 1
ours = sorted(m for m in sys.modules if m.split(".")[0] == "aiayn")
print(json.dumps({"ops": ops, "signatures": signatures, "signature_text": "\n".join(lines),
                  "outputs": outputs, "imported_project_modules": ours, "warmup": warmup,
                  "tensorflow": tf.__version__, "tensorflow_text": tensorflow_text.__version__}))
'''


class VerificationError(RuntimeError):
    """The export would not serve as-is in the stock server (or disagrees with Python)."""


@dataclasses.dataclass
class VerifyReport:
    """What :func:`verify_export` found.

    Attributes:
      export_dir: the version directory checked.
      problems: human-readable failures; empty when the export passed.
      ops: op name -> origin (``core``, ``tensorflow_text``, ``function-call``, ``unknown``).
      signatures: signature -> inputs/outputs with dtype and shape.
      signature_text: the listing in ``saved_model_cli show --all`` form.
      outputs: signature -> outputs of the fresh-process run on ``texts``.
      texts: the sentences translated.
      warmup_requests: warmup requests replayed successfully (0 unless ``replay_warmup``).
    """

    export_dir: str
    problems: list[str]
    ops: dict[str, str]
    signatures: dict[str, Any]
    signature_text: str
    outputs: dict[str, Any]
    texts: list[str]
    warmup_requests: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self) -> None:
        if self.problems:
            raise VerificationError(f"Export {self.export_dir} failed verification:\n  - "
                                    + "\n  - ".join(self.problems))

    def summary(self) -> dict[str, Any]:
        by_origin: dict[str, int] = {}
        for origin in self.ops.values():
            by_origin[origin] = by_origin.get(origin, 0) + 1
        return {"export_dir": self.export_dir, "ok": self.ok, "problems": self.problems,
                "op_types_by_origin": by_origin,
                "tensorflow_text_ops": sorted(o for o, w in self.ops.items()
                                              if w == "tensorflow_text"),
                "signatures": sorted(self.signatures), "warmup_requests": self.warmup_requests}


def _close(a: Sequence[Any], b: Sequence[Any], atol: float) -> bool:
    import numpy as np

    try:
        return bool(np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                                atol=atol, rtol=1e-4))
    except (TypeError, ValueError):
        return False


def compare_outputs(expected: Mapping[str, Any], actual: Mapping[str, Any],
                    atol: float = 1e-3) -> list[str]:
    """Differences between two ``{signature: {output: values}}`` mappings (strings exact)."""
    problems = []
    for signature, outputs in expected.items():
        got = actual.get(signature)
        if got is None:
            problems.append(f"signature {signature!r} missing from the export")
            continue
        for name, want in outputs.items():
            if name not in got:
                problems.append(f"{signature}: output {name!r} missing")
            elif name in ("score", "scores", "unknown_fraction"):
                if not _close(want, got[name], atol):
                    problems.append(f"{signature}.{name}: fresh process {got[name]} != "
                                    f"in-process {want}")
            elif want != got[name]:
                problems.append(f"{signature}.{name}: fresh process {got[name]!r} != "
                                f"in-process {want!r}")
    return problems


def verify_export(export_dir: str | os.PathLike, expected: Mapping[str, Any] | None = None,
                  texts: Sequence[str] | None = None, timeout: float = 600.0,
                  replay_warmup: bool = False) -> VerifyReport:
    """Checks an export in a fresh process (ops, signatures, outputs) and compares outputs.

    Args:
      export_dir: a version directory ``<base>/<name>/<version>``.
      expected: ``{signature: {output: values}}`` from in-process translation of ``texts``;
        default: ``assets.extra/verify_samples.json`` written at export time.
      texts: sentences to translate; default: the stored samples.
      timeout: seconds allowed for the child process.
      replay_warmup: also replay ``assets.extra/tf_serving_warmup_requests`` in the child (a
        missing or unreadable file, or a request that fails, is a problem).

    Returns:
      A :class:`VerifyReport`; call ``raise_if_failed()`` to turn problems into an error.

    Raises:
      VerificationError: the child process could not load or run the export.
      FileNotFoundError: ``export_dir`` has no ``saved_model.pb``.
    """
    export_dir = Path(export_dir).resolve()
    if not (export_dir / "saved_model.pb").exists():
        raise FileNotFoundError(f"{export_dir} has no saved_model.pb; pass a version "
                                "directory such as exports/translate/1.")
    texts, expected = _stored_samples(export_dir, expected, texts)
    child, warmup_problems = _run_child(export_dir, texts, timeout, replay_warmup)
    sigs = child["signatures"]
    problems = _op_problems(child) + _signature_problems(sigs)
    if expected and child["outputs"]:
        problems += compare_outputs(expected, child["outputs"])
    problems += warmup_problems + child["warmup"]["failures"]
    return VerifyReport(export_dir=str(export_dir), problems=problems, ops=child["ops"],
                        signatures=sigs, signature_text=child["signature_text"],
                        outputs=child["outputs"], texts=texts,
                        warmup_requests=child["warmup"]["replayed"])


def _stored_samples(export_dir: Path, expected: Mapping[str, Any] | None,
                    texts: Sequence[str] | None
                    ) -> tuple[list[str], Mapping[str, Any] | None]:
    """``texts`` and ``expected``, defaulting to the samples stored at export time."""
    samples_path = export_dir / "assets.extra" / SAMPLES_FILE
    stored = json.loads(samples_path.read_text(encoding="utf-8")) if samples_path.exists() else {}
    if texts is None:
        texts = stored.get("texts") or ["Hello world.", ""]
        if expected is None and stored:
            expected = {k: stored[k] for k in (SERVING_SIGNATURE, NBEST_SIGNATURE) if k in stored}
    return list(texts), expected


def _run_child(export_dir: Path, texts: list[str], timeout: float,
               replay_warmup: bool) -> tuple[dict[str, Any], list[str]]:
    """Runs :data:`_CHILD` on the export; its JSON report, and problems reading the warmup file.

    Raises:
      VerificationError: the child exited non-zero or printed no report.
    """
    with tempfile.TemporaryDirectory(prefix="aiayn-verify-") as tmp:
        texts_path = Path(tmp) / "texts.json"
        texts_path.write_text(json.dumps(texts), encoding="utf-8")
        args = [str(export_dir), str(texts_path)]
        warmup_problems: list[str] = []
        if replay_warmup:
            requests, warmup_problems = _warmup_requests(export_dir)
            warmup_path = Path(tmp) / "warmup.json"
            warmup_path.write_text(json.dumps(requests), encoding="utf-8")
            args.append(str(warmup_path))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.setdefault("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        # cwd = an empty directory, so that nothing of the repository is importable by accident.
        proc = subprocess.run([sys.executable, "-c", _CHILD, *args],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise VerificationError(f"The fresh process could not load/run {export_dir} "
                                f"(exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1]), warmup_problems


def _op_problems(child: Mapping[str, Any]) -> list[str]:
    """Ops the stock server cannot run, and project modules the fresh process imported."""
    problems = []
    for op, origin in child["ops"].items():
        if op in FORBIDDEN_OPS:
            problems.append(f"op {op} is a Python callback; the model server cannot run it")
        elif origin == "unknown":
            problems.append(f"op {op} is neither core TensorFlow nor tensorflow-text "
                            "(a custom op the stock tensorflow_model_server lacks)")
    if child["imported_project_modules"]:
        problems.append(f"the fresh process imported project code: "
                        f"{child['imported_project_modules']}")
    return problems


def _signature_problems(sigs: Mapping[str, Any]) -> list[str]:
    """Missing signatures, and inputs/outputs that differ from what clients send and read."""
    problems = []
    for key, outputs in ((SERVING_SIGNATURE, {"translation": "DT_STRING", "score": "DT_FLOAT"}),
                         (NBEST_SIGNATURE, {"translations": "DT_STRING", "scores": "DT_FLOAT",
                                            "truncated": "DT_BOOL",
                                            "unknown_fraction": "DT_FLOAT"})):
        if key not in sigs:
            problems.append(f"signature {key!r} missing")
            continue
        inputs = sigs[key]["inputs"]
        if inputs != {"text": {"dtype": "DT_STRING", "shape": [-1]}}:
            problems.append(f"{key}: inputs must be {{'text': DT_STRING [-1]}}; got {inputs}")
        for name, dtype in outputs.items():
            spec = sigs[key]["outputs"].get(name)
            if spec is None or spec["dtype"] != dtype:
                problems.append(f"{key}: output {name!r} must be {dtype}; got {spec}")
    return problems


def _warmup_requests(export_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The export's warmup PredictRequests as ``{"signature", "inputs"}`` (strings base64),
    and problems reading them (no file, a record that does not parse, a non-string input)."""
    import base64

    from aiayn.export.warmup import read_warmup_requests

    path = export_dir / "assets.extra" / WARMUP_FILE
    if not path.exists():
        return [], [f"no warmup requests ({path.relative_to(export_dir)} is missing); TF "
                    "Serving would load the version cold"]
    try:
        logs = read_warmup_requests(path)
    except Exception as err:  # a corrupt TFRecord or PredictionLog: the server refuses it too
        return [], [f"the warmup file {path.name} cannot be read: {type(err).__name__}: "
                    f"{(str(err).strip().splitlines() or [''])[0]}"]
    import tensorflow as tf

    requests, problems = [], []
    for number, log in enumerate(logs, start=1):
        request = log.predict_log.request
        inputs = {}
        for name, proto in request.inputs.items():
            if proto.dtype != tf.string.as_datatype_enum:  # the signatures take strings only
                problems.append(f"warmup request {number}: input {name!r} is "
                                f"{tf.as_dtype(proto.dtype).name}, not a string")
                continue
            inputs[name] = [base64.b64encode(v).decode("ascii")
                            for v in tf.make_ndarray(proto).reshape(-1)]
        requests.append({"signature": request.model_spec.signature_name or SERVING_SIGNATURE,
                         "inputs": inputs})
    if not requests:
        problems.append(f"the warmup file {path.name} holds no requests")
    return requests, problems
