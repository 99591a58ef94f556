"""A development server that speaks TF Serving's REST and gRPC APIs from an export base dir.

For machines without ``tensorflow_model_server`` or Docker. It serves the same directory layout
(``<base_dir>/<model_name>/<version>/``), the same URLs, protos and error shapes:

    REST (default 127.0.0.1:8501)
      POST /v1/models/<name>[/versions/<v>]:predict   {"instances": [...]} | {"inputs": ...}
      GET  /v1/models/<name>[/versions/<v>]           model status
      GET  /v1/models/<name>[/versions/<v>]/metadata  signature defs
    gRPC (default 127.0.0.1:8500)
      tensorflow.serving.PredictionService/Predict, /GetModelMetadata
      tensorflow.serving.ModelService/GetModelStatus

Like TF Serving it polls the base directory and loads a new version when one appears (serving
the old one until the new one is loaded and warmed up from ``assets.extra/
tf_serving_warmup_requests``), keeps the latest version, and batches concurrent requests: a
queue per signature merges requests up to ``max_batch_size`` rows or ``batch_timeout_ms``.
Errors never stop the server; REST errors are ``{"error": "..."}`` with TF Serving's status
codes (INVALID_ARGUMENT -> 400, NOT_FOUND -> 404, ...), gRPC errors the matching status code.

Example::

    server = DevServer("exports", rest_port=8501, grpc_port=8500)
    server.start()          # returns at once; server.rest_port / server.grpc_port are bound
    ...
    server.stop()
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops, as the stock server links them

from aiayn.export.saved_model import (SAMPLES_FILE, WARMUP_FILE,
                                      list_versions)

log = logging.getLogger("aiayn.export.server")

# TF Serving's mapping of status codes to HTTP (tensorflow_serving/model_servers/http_server.cc).
HTTP_STATUS = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400,
               "NOT_FOUND": 404, "UNIMPLEMENTED": 501, "UNAVAILABLE": 503,
               "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500, "UNKNOWN": 500,
               "DEADLINE_EXCEEDED": 504}
_DTYPE_NAMES = {np.dtype(np.float32): "DT_FLOAT", np.dtype(np.float64): "DT_DOUBLE",
                np.dtype(np.int32): "DT_INT32", np.dtype(np.int64): "DT_INT64",
                np.dtype(np.bool_): "DT_BOOL", np.dtype(object): "DT_STRING"}


class ServingError(Exception):
    """An error with a TF Serving status code (``INVALID_ARGUMENT``, ``NOT_FOUND``, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


def _invalid(message: str) -> ServingError:
    return ServingError("INVALID_ARGUMENT", message)


# -- batching ----------------------------------------------------------------------------------
@dataclasses.dataclass
class _Task:
    texts: np.ndarray  # object array of bytes, (rows,)
    future: concurrent.futures.Future


class Batcher:
    """Merges concurrent requests into one batch per call of ``fn`` (like TF Serving's batcher).

    Args:
      fn: ``fn(texts: np.ndarray[object] (rows,)) -> dict[str, np.ndarray]`` with outputs whose
        first dimension is ``rows``.
      max_batch_size: the most rows in one merged batch.
      batch_timeout_ms: how long the first request waits for others to join.
    """

    def __init__(self, fn: Callable[[np.ndarray], dict[str, np.ndarray]], max_batch_size: int,
                 batch_timeout_ms: float = 5.0, name: str = "batcher"):
        self.fn = fn
        self.max_batch_size = max_batch_size
        self.timeout = batch_timeout_ms / 1000.0
        self._queue: list[_Task] = []
        self._cv = threading.Condition()
        self._closed = False
        self.batches_run = 0
        self.largest_batch = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, texts: np.ndarray) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                future.set_exception(ServingError("UNAVAILABLE", "The servable was unloaded."))
                return future
            self._queue.append(_Task(texts, future))
            self._cv.notify()
        return future

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _take(self) -> list[_Task]:
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if not self._queue:
                return []
            deadline = time.monotonic() + self.timeout
            while not self._closed:
                rows = sum(len(t.texts) for t in self._queue)
                left = deadline - time.monotonic()
                if rows >= self.max_batch_size or left <= 0:
                    break
                self._cv.wait(left)
            batch, rows = [], 0
            while self._queue and rows + len(self._queue[0].texts) <= self.max_batch_size:
                task = self._queue.pop(0)
                batch.append(task)
                rows += len(task.texts)
            if not batch:  # a single over-sized task (callers check sizes; never stall)
                batch.append(self._queue.pop(0))
            return batch

    def _run(self, tasks: list[_Task]) -> None:
        texts = np.concatenate([t.texts for t in tasks])
        try:
            outputs = self.fn(texts)
        except Exception as err:  # noqa: BLE001 - reported per request below
            if len(tasks) > 1:
                # One bad request (e.g. rejected as too long) must not fail its batch-mates.
                for task in tasks:
                    self._run([task])
                return
            tasks[0].future.set_exception(err)
            return
        self.batches_run += 1
        self.largest_batch = max(self.largest_batch, len(texts))
        start = 0
        for task in tasks:
            end = start + len(task.texts)
            task.future.set_result({k: v[start:end] for k, v in outputs.items()})
            start = end

    def _loop(self) -> None:
        while True:
            tasks = self._take()
            if not tasks:
                return
            self._run(tasks)


# -- servables ---------------------------------------------------------------------------------
def _tf_error_to_serving(err: Exception) -> ServingError:
    if isinstance(err, ServingError):
        return err
    if isinstance(err, tf.errors.InvalidArgumentError):
        message = err.message.split("\n")[0] if err.message else str(err)
        # Keep the in-graph assertion's message (and its data line) readable.
        lines = [line.strip() for line in (err.message or "").splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("[[") and "{{" not in line]
        return _invalid(" ".join(lines[:3]) or message)
    if isinstance(err, tf.errors.OpError):
        return ServingError("INTERNAL", err.message)
    return ServingError("INTERNAL", f"{type(err).__name__}: {err}")


class Servable:
    """One loaded version: its signatures, metadata and a batcher per signature."""

    def __init__(self, name: str, version: int, path: Path, max_batch_size: int | None,
                 batch_timeout_ms: float):
        self.name = name
        self.version = version
        self.path = path
        self.loaded = tf.saved_model.load(str(path))
        self.signatures = dict(self.loaded.signatures)
        self.samples = {}
        samples_path = path / "assets.extra" / SAMPLES_FILE
        if samples_path.exists():
            self.samples = json.loads(samples_path.read_text(encoding="utf-8"))
        options = self.samples.get("options", {})
        self.max_batch_size = int(max_batch_size or options.get("max_batch_size") or 64)
        self.input_limit = self.samples.get("input_limit")
        self.on_long_input = options.get("on_long_input", "truncate")
        self._sp = None
        spm_path = path / "assets.extra" / "spm.model"
        if spm_path.exists():
            try:
                import sentencepiece

                self._sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_path))
            except (ImportError, OSError, RuntimeError):  # pragma: no cover - optional
                self._sp = None
        self.batchers = {key: Batcher(self._runner(key), self.max_batch_size, batch_timeout_ms,
                                      name=f"{name}/{version}/{key}")
                         for key in self.signatures}

    def _runner(self, key: str) -> Callable[[np.ndarray], dict[str, np.ndarray]]:
        fn = self.signatures[key]
        (input_name,) = fn.structured_input_signature[1].keys()

        def run(texts: np.ndarray) -> dict[str, np.ndarray]:
            out = fn(**{input_name: tf.constant(list(texts), tf.string)})
            return {k: v.numpy() for k, v in out.items()}

        return run

    def signature_inputs(self, key: str) -> dict[str, tf.TensorSpec]:
        return dict(self.signatures[key].structured_input_signature[1])

    def signature_outputs(self, key: str) -> dict[str, tf.TensorSpec]:
        return dict(self.signatures[key].structured_outputs)

    def long_inputs(self, texts: np.ndarray) -> list[tuple[int, int]]:
        """(index, token count) of inputs over the exported limit (needs spm in assets.extra)."""
        if self._sp is None or not self.input_limit:
            return []
        counts = self._sp.encode([t.decode("utf-8") for t in texts])
        return [(i, len(c)) for i, c in enumerate(counts) if len(c) > self.input_limit]

    def warmup(self) -> int:
        """Replays ``assets.extra/tf_serving_warmup_requests``; returns the requests run."""
        path = self.path / "assets.extra" / WARMUP_FILE
        if not path.exists():
            return 0
        from tensorflow_serving.apis import prediction_log_pb2

        count = 0
        for record in tf.data.TFRecordDataset(str(path)):
            entry = prediction_log_pb2.PredictionLog.FromString(record.numpy())
            request = entry.predict_log.request
            key = request.model_spec.signature_name or "serving_default"
            if key not in self.signatures:
                continue
            inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            self.signatures[key](**{k: tf.constant(v) for k, v in inputs.items()})
            count += 1
        return count

    def close(self) -> None:
        for batcher in self.batchers.values():
            batcher.close()


class ModelManager:
    """Watches ``base_dir`` and keeps the latest version of each model loaded.

    Args:
      base_dir: the export base directory (``<base_dir>/<name>/<version>/``).
      model_names: serve only these names; default: every folder with integer versions.
      poll_seconds: how often the directory is scanned for new versions.
      max_batch_size: batch limit; default: the export's own (``export.max_batch_size``).
      batch_timeout_ms: how long a request waits for batch-mates.
      warmup: replay the export's warmup requests before serving a version.
    """

    def __init__(self, base_dir: str | Path, model_names: list[str] | None = None,
                 poll_seconds: float = 2.0, max_batch_size: int | None = None,
                 batch_timeout_ms: float = 5.0, warmup: bool = True):
        self.base_dir = Path(base_dir)
        self.model_names = list(model_names) if model_names else None
        self.poll_seconds = poll_seconds
        self.max_batch_size = max_batch_size
        self.batch_timeout_ms = batch_timeout_ms
        self.warmup = warmup
        self._servables: dict[str, dict[int, Servable]] = {}
        self._failed: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _candidates(self) -> list[str]:
        if self.model_names:
            return self.model_names
        if not self.base_dir.is_dir():
            return []
        return sorted(p.name for p in self.base_dir.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and list_versions(p))

    def scan(self) -> None:
        """Loads any newer version and unloads older ones (TF Serving's latest-1 policy)."""
        for name in self._candidates():
            versions = list_versions(self.base_dir / name)
            if not versions:
                continue
            latest = versions[-1]
            current = self._servables.get(name, {})
            if latest in current or (name, latest) in self._failed:
                continue
            path = self.base_dir / name / str(latest)
            try:
                started = time.monotonic()
                servable = Servable(name, latest, path, self.max_batch_size,
                                    self.batch_timeout_ms)
                warmed = servable.warmup() if self.warmup else 0
                log.info("Loaded %s version %d in %.1fs (%d warmup requests).", name, latest,
                         time.monotonic() - started, warmed)
            except Exception as err:  # noqa: BLE001 - keep serving the old version
                log.error("Could not load %s: %s", path, err)
                self._failed[(name, latest)] = time.time()
                continue
            with self._lock:
                old = self._servables.get(name, {})
                self._servables[name] = {latest: servable}
            for servable_old in old.values():
                servable_old.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.scan()
            except Exception:  # noqa: BLE001 - the poller must survive anything
                log.exception("Scanning %s failed.", self.base_dir)

    def start(self) -> None:
        self.scan()
        self._thread = threading.Thread(target=self._loop, name="version-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            servables = [s for by_v in self._servables.values() for s in by_v.values()]
            self._servables = {}
        for servable in servables:
            servable.close()

    def get(self, name: str, version: int | None = None) -> Servable:
        """The servable for a request, or NOT_FOUND in TF Serving's words."""
        with self._lock:
            by_version = self._servables.get(name)
            if not by_version:
                request = f"Latest({name})" if version is None else f"Specific({name}, {version})"
                raise ServingError("NOT_FOUND", f"Servable not found for request: {request}")
            if version is None:
                return by_version[max(by_version)]
            if version not in by_version:
                raise ServingError(
                    "NOT_FOUND", f"Servable not found for request: Specific({name}, {version}). "
                                 f"Available version(s): {sorted(by_version)}")
            return by_version[version]

    def versions(self, name: str) -> list[int]:
        with self._lock:
            return sorted(self._servables.get(name, {}))


# -- the protocol-independent core -------------------------------------------------------------
def _check_strings(values: np.ndarray, input_name: str) -> np.ndarray:
    """Validates a string input: rank 1, bytes, valid UTF-8. Returns an object array of bytes."""
    if values.ndim != 1:
        raise _invalid(f"Input '{input_name}' must be a vector of strings, shape [batch]; got "
                       f"shape {list(values.shape)}. Send one string per instance.")
    if values.dtype != object or not all(isinstance(v, bytes) for v in values):
        raise _invalid(f"Input '{input_name}' must be DT_STRING; got "
                       f"{_DTYPE_NAMES.get(values.dtype, str(values.dtype))}. Send text.")
    for i, value in enumerate(values):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _invalid(f"Input '{input_name}' element {i} is not valid UTF-8 (byte "
                           f"{err.start}: {value[err.start:err.start + 1]!r}). Send UTF-8 "
                           "text.") from None
    return values


def _closest(word: str, options: list[str]) -> str:
    import difflib

    match = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f" Did you mean '{match[0]}'?" if match else ""


class Predictor:
    """Validates and runs one Predict call; shared by the REST and gRPC front ends."""

    def __init__(self, manager: ModelManager):
        self.manager = manager

    def predict(self, name: str, version: int | None, signature_name: str,
                inputs: Mapping[str, np.ndarray]) -> tuple[Servable, str, dict[str, np.ndarray]]:
        servable = self.manager.get(name, version)
        key = signature_name or "serving_default"
        if key not in servable.signatures:
            raise _invalid(f"Serving signature key \"{key}\" not found. Available: "
                           f"{sorted(servable.signatures)}.{_closest(key, list(servable.signatures))}")
        expected = list(servable.signature_inputs(key))
        extra = sorted(set(inputs) - set(expected))
        missing = sorted(set(expected) - set(inputs))
        if extra or missing:
            hint = _closest(extra[0], expected) if extra else ""
            raise _invalid(f"input size does not match signature: {len(inputs)}!="
                           f"{len(expected)} len({{{', '.join(sorted(inputs))}}}) != "
                           f"len({{{', '.join(expected)}}}). Sent extra: {extra}. Missing but "
                           f"required: {missing}.{hint}")
        (input_name,) = expected
        texts = _check_strings(np.asarray(inputs[input_name]), input_name)
        if len(texts) > servable.max_batch_size:
            raise _invalid(f"Task size {len(texts)} is larger than maximum input batch size "
                           f"{servable.max_batch_size}. Split the request into batches of at "
                           f"most {servable.max_batch_size} (export.max_batch_size).")
        if len(texts) == 0:
            outputs = servable.signature_outputs(key)
            return servable, key, {
                k: np.zeros([0] + [d or 0 for d in spec.shape[1:]],
                            dtype=object if spec.dtype == tf.string else spec.dtype.as_numpy_dtype)
                for k, spec in outputs.items()}
        long = servable.long_inputs(texts)
        if long and servable.on_long_input == "reject":
            i, n = long[0]
            raise _invalid(f"Input text is too long: element {i} has {n} subword tokens; the "
                           f"model accepts at most {servable.input_limit} "
                           "(export.max_input_tokens). Split it into sentences, or re-export "
                           "with export.on_long_input=truncate.")
        if long:
            log.warning("%s/%d: truncated %d input(s) to %d subword tokens: %s", name,
                        servable.version, len(long), servable.input_limit,
                        ", ".join(f"#{i} ({n} tokens)" for i, n in long))
        future = servable.batchers[key].submit(texts)
        try:
            outputs = future.result()
        except Exception as err:  # noqa: BLE001
            raise _tf_error_to_serving(err) from None
        return servable, key, outputs


# -- REST --------------------------------------------------------------------------------------
_URL = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?"
                  r"(?:/labels/(?P<label>[^/:]+))?(?P<rest>/metadata|:[a-zA-Z]+)?/?$")
_BODY_KEYS = ("signature_name", "instances", "inputs")


def _decode_json_value(value: Any, where: str) -> Any:
    """JSON value -> bytes for strings ({"b64": ...} too); other types pass for dtype checks."""
    if isinstance(value, str):
        return value.encode("utf-8", errors="surrogatepass")
    if isinstance(value, dict):
        if set(value) == {"b64"} and isinstance(value["b64"], str):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except ValueError:
                raise _invalid(f"{where}: 'b64' value is not valid base64.") from None
        raise _invalid(f"{where}: expected a string, got an object with keys {sorted(value)}.")
    return value


def _to_array(values: list[Any], input_name: str) -> np.ndarray:
    if any(isinstance(v, list) for v in values):
        raise _invalid(f"Input '{input_name}' must be a vector of strings, shape [batch]; got a "
                       "nested list (rank > 1). Send one string per instance.")
    if values and all(isinstance(v, bytes) for v in values):
        return np.array(values, dtype=object)
    bad = next((v for v in values if not isinstance(v, bytes)), None)
    if bad is not None:
        kind = {bool: "Bool", int: "Number", float: "Number", type(None): "Null"}.get(
            type(bad), type(bad).__name__)
        raise _invalid(f"JSON Value: {json.dumps(bad)} Type: {kind} is not of expected type: "
                       f"string (input '{input_name}').")
    return np.array(values, dtype=object)


def parse_rest_request(body: bytes, input_names: list[str]) -> tuple[str, str, dict[str, np.ndarray]]:
    """Parses a TF Serving REST predict body -> (format, signature_name, inputs)."""
    try:
        request = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise _invalid(f"The request body is not valid UTF-8 (byte {err.start}); JSON must be "
                       "UTF-8. Send binary strings as {\"b64\": \"...\"}.") from None
    except json.JSONDecodeError as err:
        raise _invalid(f"JSON Parse error: {err.msg} at offset {err.pos}") from None
    if not isinstance(request, dict):
        raise _invalid("The request body must be a JSON object with 'instances' or 'inputs'.")
    unknown = [k for k in request if k not in _BODY_KEYS]
    if unknown:
        raise _invalid(f"Unknown key '{unknown[0]}' in the request body.{_closest(unknown[0], list(_BODY_KEYS))} "
                       f"Valid keys: {', '.join(_BODY_KEYS)}.")
    signature = request.get("signature_name", "")
    if not isinstance(signature, str):
        raise _invalid("'signature_name' must be a string.")
    if "instances" in request and "inputs" in request:
        raise _invalid("Request body should not contain both 'instances' and 'inputs' keys; "
                       "use one (row or columnar format).")
    if "instances" in request:
        instances = request["instances"]
        if not isinstance(instances, list):
            raise _invalid("'instances' must be a JSON list, one element per example.")
        columns: dict[str, list[Any]] = {}
        for i, instance in enumerate(instances):
            if isinstance(instance, dict) and not (set(instance) == {"b64"}):
                for key, value in instance.items():
                    columns.setdefault(key, []).append(
                        _decode_json_value(value, f"instances[{i}].{key}"))
                missing = [n for n in input_names if n not in instance]
                if missing and not (set(instance) - set(input_names)):
                    raise _invalid(f"instances[{i}] is missing input '{missing[0]}'.")
            else:
                if len(input_names) != 1:
                    raise _invalid("Each instance must be an object naming the inputs "
                                   f"{input_names}.")
                columns.setdefault(input_names[0], []).append(
                    _decode_json_value(instance, f"instances[{i}]"))
        lengths = {len(v) for v in columns.values()}
        if len(lengths) > 1:
            raise _invalid("Every instance must name the same inputs.")
        if not instances:
            columns = {name: [] for name in input_names}
        return "row", signature, {k: _to_array(v, k) for k, v in columns.items()}
    if "inputs" in request:
        inputs = request["inputs"]
        if isinstance(inputs, dict) and not set(inputs) == {"b64"}:
            named = inputs
        elif len(input_names) == 1:
            named = {input_names[0]: inputs}
        else:
            raise _invalid(f"'inputs' must be an object naming the inputs {input_names}.")
        out = {}
        for key, value in named.items():
            if not isinstance(value, list):
                raise _invalid(f"Input '{key}' must be a vector of strings, shape [batch]; got "
                               "a scalar. Wrap it in a list.")
            out[key] = _to_array([_decode_json_value(v, f"inputs.{key}[{i}]")
                                  for i, v in enumerate(value)], key)
        return "columnar", signature, out
    raise _invalid("Missing 'inputs' or 'instances' key in the request body.")


def _json_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_json_value(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def format_rest_response(fmt: str, outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """TF Serving's response: ``predictions`` (row) or ``outputs`` (columnar)."""
    names = sorted(outputs)
    if fmt == "row":
        if len(names) == 1:
            return {"predictions": _json_value(outputs[names[0]])}
        rows = len(next(iter(outputs.values())))
        return {"predictions": [{k: _json_value(outputs[k][i]) for k in names}
                                for i in range(rows)]}
    if len(names) == 1:
        return {"outputs": _json_value(outputs[names[0]])}
    return {"outputs": {k: _json_value(outputs[k]) for k in names}}


def _dtype_enum_name(dtype: tf.DType) -> str:
    from tensorflow.core.framework import types_pb2

    return types_pb2.DataType.Name(dtype.as_datatype_enum)


def signature_def_map(servable: Servable):
    """The servable's SignatureDefMap proto (as GetModelMetadata returns it)."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    sm = saved_model_pb2.SavedModel.FromString((servable.path / "saved_model.pb").read_bytes())
    result = get_model_metadata_pb2.SignatureDefMap()
    for key, sig in sm.meta_graphs[0].signature_def.items():
        result.signature_def[key].CopyFrom(sig)
    return result


def model_status_proto(manager: ModelManager, name: str, version: int | None):
    from tensorflow_serving.apis import get_model_status_pb2

    versions = manager.versions(name)
    if not versions:
        raise ServingError("NOT_FOUND", f"Could not find any versions of model {name}")
    if version is not None and version not in versions:
        raise ServingError("NOT_FOUND", f"Could not find version {version} of model {name}")
    response = get_model_status_pb2.GetModelStatusResponse()
    for v in ([version] if version is not None else versions):
        status = response.model_version_status.add()
        status.version = v
        status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
        status.status.error_code = 0
        status.status.error_message = ""
    return response


class _RestHandler(BaseHTTPRequestHandler):
    server_version = "aiayn-dev-serving/1"
    predictor: Predictor  # set on the subclass

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet; use logging
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, err: ServingError) -> None:
        self._send(err.http_status, {"error": err.message})

    def _route(self, method: str) -> tuple[str, int | None, str]:
        match = _URL.match(self.path.split("?")[0])
        if not match:
            raise ServingError("NOT_FOUND", f"Malformed request: {method} {self.path}")
        version = match.group("version")
        if version is not None:
            if not version.isdigit():
                raise _invalid(f"Model version must be an integer; got '{version}'.")
            version = int(version)
        if match.group("label"):
            raise ServingError("UNIMPLEMENTED", "Version labels are not supported by the "
                                                "development server; use /versions/<v>.")
        return match.group("name"), version, match.group("rest") or ""

    def do_GET(self) -> None:  # noqa: N802
        try:
            name, version, rest = self._route("GET")
            manager = self.predictor.manager
            if rest == "/metadata":
                from google.protobuf import json_format

                servable = manager.get(name, version)
                self._send(200, {
                    "model_spec": {"name": name, "signature_name": "",
                                   "version": str(servable.version)},
                    "metadata": {"signature_def": json_format.MessageToDict(
                        signature_def_map(servable), preserving_proto_field_name=True)}})
            elif rest == "":
                from google.protobuf import json_format

                status = model_status_proto(manager, name, version)
                self._send(200, json_format.MessageToDict(
                    status, preserving_proto_field_name=True,
                    always_print_fields_with_no_presence=True))
            else:
                raise ServingError("NOT_FOUND", f"Malformed request: GET {self.path}")
        except ServingError as err:
            self._error(err)
        except Exception as err:  # noqa: BLE001 - the server stays up
            log.exception("GET %s failed", self.path)
            self._error(ServingError("INTERNAL", str(err)))

    def do_POST(self) -> None:  # noqa: N802
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            name, version, rest = self._route("POST")
            if rest != ":predict":
                if rest in (":classify", ":regress"):
                    raise ServingError("UNIMPLEMENTED", f"{rest[1:]} is not supported; this "
                                                        "model has predict signatures only.")
                raise ServingError("NOT_FOUND", f"Malformed request: POST {self.path}")
            servable = self.predictor.manager.get(name, version)
            fmt, signature, inputs = parse_rest_request(
                body, list(servable.signature_inputs(
                    signature_or_default(signature_hint(body), servable))))
            _, _, outputs = self.predictor.predict(name, servable.version, signature, inputs)
            self._send(200, format_rest_response(fmt, outputs))
        except ServingError as err:
            self._error(err)
        except Exception as err:  # noqa: BLE001 - the server stays up
            log.exception("POST %s failed", self.path)
            self._error(ServingError("INTERNAL", str(err)))


def signature_hint(body: bytes) -> str:
    """The signature_name of a body, if it parses (for input names); '' otherwise."""
    try:
        value = json.loads(body.decode("utf-8")).get("signature_name", "")
        return value if isinstance(value, str) else ""
    except (ValueError, AttributeError):
        return ""


def signature_or_default(key: str, servable: Servable) -> str:
    key = key or "serving_default"
    if key not in servable.signatures:
        raise _invalid(f"Serving signature key \"{key}\" not found. Available: "
                       f"{sorted(servable.signatures)}.{_closest(key, list(servable.signatures))}")
    return key


# -- gRPC --------------------------------------------------------------------------------------
def _grpc_services(predictor: Predictor):
    import grpc
    from tensorflow_serving.apis import (get_model_metadata_pb2, model_service_pb2_grpc,
                                         predict_pb2, prediction_service_pb2_grpc)

    codes = {name: getattr(grpc.StatusCode, name) for name in HTTP_STATUS}

    def abort(context, err: ServingError):
        context.abort(codes.get(err.code, grpc.StatusCode.INTERNAL), err.message)

    def spec_version(spec) -> int | None:
        return spec.version.value if spec.HasField("version") else None

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        def Predict(self, request, context):  # noqa: N802
            try:
                inputs = {}
                for key, proto in request.inputs.items():
                    if proto.dtype != tf.string.as_datatype_enum:
                        inputs[key] = np.zeros([d.size for d in proto.tensor_shape.dim],
                                               dtype=tf.as_dtype(proto.dtype).as_numpy_dtype)
                    else:
                        inputs[key] = tf.make_ndarray(proto)
                servable, key, outputs = predictor.predict(
                    request.model_spec.name, spec_version(request.model_spec),
                    request.model_spec.signature_name, inputs)
                response = predict_pb2.PredictResponse()
                response.model_spec.name = servable.name
                response.model_spec.version.value = servable.version
                response.model_spec.signature_name = key
                wanted = set(request.output_filter) or set(outputs)
                for name, value in outputs.items():
                    if name in wanted:
                        response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
                return response
            except ServingError as err:
                abort(context, err)
            except (TypeError, ValueError) as err:
                abort(context, _invalid(f"Could not read the input tensor: {err}"))

        def GetModelMetadata(self, request, context):  # noqa: N802
            try:
                fields = list(request.metadata_field)
                if fields != ["signature_def"]:
                    raise _invalid("Metadata field signature_def must be requested (and only "
                                   f"it); got {fields}.")
                servable = predictor.manager.get(request.model_spec.name,
                                                 spec_version(request.model_spec))
                response = get_model_metadata_pb2.GetModelMetadataResponse()
                response.model_spec.name = servable.name
                response.model_spec.version.value = servable.version
                response.metadata["signature_def"].Pack(signature_def_map(servable))
                return response
            except ServingError as err:
                abort(context, err)

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        def GetModelStatus(self, request, context):  # noqa: N802
            try:
                return model_status_proto(predictor.manager, request.model_spec.name,
                                          spec_version(request.model_spec))
            except ServingError as err:
                abort(context, err)

    return (PredictionService(), prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server,
            ModelService(), model_service_pb2_grpc.add_ModelServiceServicer_to_server)


class _HTTPServer(ThreadingHTTPServer):
    # The default listen backlog (5) resets connections under 32 concurrent clients.
    request_queue_size = 256
    daemon_threads = True


# -- the server --------------------------------------------------------------------------------
class DevServer:
    """REST + gRPC development server over an export base directory.

    Args:
      base_dir: the directory ``aiayn export`` writes (``<base>/<name>/<version>/``).
      model_names: names to serve; default: every model folder found.
      host: interface to bind; 127.0.0.1 unless told otherwise.
      rest_port: REST port (0 = any free port; None = no REST).
      grpc_port: gRPC port (0 = any free port; None = no gRPC).
      poll_seconds: how often to look for new versions.
      max_batch_size: batch limit; default: the export's ``max_batch_size``.
      batch_timeout_ms: how long a request waits for batch-mates.
      warmup: replay the warmup requests before serving a version.
      threads: worker threads per front end.
    """

    def __init__(self, base_dir: str | Path, model_names: list[str] | None = None,
                 host: str = "127.0.0.1", rest_port: int | None = 8501,
                 grpc_port: int | None = 8500, poll_seconds: float = 2.0,
                 max_batch_size: int | None = None, batch_timeout_ms: float = 5.0,
                 warmup: bool = True, threads: int = 32):
        self.manager = ModelManager(base_dir, model_names, poll_seconds, max_batch_size,
                                    batch_timeout_ms, warmup)
        self.predictor = Predictor(self.manager)
        self.host = host
        self.rest_port = rest_port
        self.grpc_port = grpc_port
        self.threads = threads
        self._http: ThreadingHTTPServer | None = None
        self._grpc = None

    def start(self) -> "DevServer":
        """Loads the models and binds the ports; returns at once (threads serve)."""
        self.manager.start()
        if self.rest_port is not None:
            handler = type("Handler", (_RestHandler,), {"predictor": self.predictor})
            self._http = _HTTPServer((self.host, self.rest_port), handler)
            self._http.daemon_threads = True
            self.rest_port = self._http.server_address[1]
            threading.Thread(target=self._http.serve_forever, name="rest", daemon=True).start()
        if self.grpc_port is not None:
            import grpc

            self._grpc = grpc.server(concurrent.futures.ThreadPoolExecutor(self.threads))
            prediction, add_prediction, model, add_model = _grpc_services(self.predictor)
            add_prediction(prediction, self._grpc)
            add_model(model, self._grpc)
            self.grpc_port = self._grpc.add_insecure_port(f"{self.host}:{self.grpc_port}")
            self._grpc.start()
        log.info("Serving %s: REST %s:%s, gRPC %s:%s", self.manager.base_dir, self.host,
                 self.rest_port, self.host, self.grpc_port)
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait()
        self.manager.stop()

    def serve_forever(self) -> None:
        """Starts and blocks until interrupted (Ctrl-C)."""
        self.start()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
