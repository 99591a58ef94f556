"""The development server's REST front end (TF Serving's REST API).

Parses predict bodies in both of TF Serving's forms (:func:`parse_rest_request`: row
``{"instances": [...]}`` and columnar ``{"inputs": ...}``, strings as JSON strings or
``{"b64": ...}``), formats the matching response (:func:`format_rest_response`), and answers
the URLs below with :class:`RestApp`, which :func:`make_rest_server` puts on a bounded
:class:`~aiayn.export.http_server.PooledHTTPServer`::

    POST /v1/models/<name>[/versions/<v> | /labels/<l>]:predict
    GET  /v1/models/<name>[/versions/<v> | /labels/<l>]           model status
    GET  /v1/models/<name>[/versions/<v> | /labels/<l>]/metadata  signature defs

Errors are ``{"error": "..."}`` with the HTTP status of their TF Serving code: every fault of
the client is a 4xx (malformed, over-deep or over-long JSON, numbers out of range, wrong types,
unknown keys, models, versions, labels or signatures); a 5xx means a fault of the server and is
logged with its traceback.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from aiayn.export.codec import to_python
from aiayn.export.http_server import (
    HttpLimits,
    HttpRequest,
    HttpResponse,
    PooledHTTPServer,
    error_response,
    json_response,
)
from aiayn.export.manager import model_status_proto
from aiayn.export.predictor import Predictor, batch_too_large, signature_or_default
from aiayn.export.servables import signature_def_map
from aiayn.export.serving_errors import ServingError, clip, closest, invalid

log = logging.getLogger("aiayn.export.server")

_URL = re.compile(r"^/v1/models/(?P<name>[^/:]+)"
                  r"(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
                  r"(?P<rest>/metadata|:[a-zA-Z]+)?/?$")
_BODY_KEYS = ("signature_name", "instances", "inputs")
MAX_JSON_DEPTH = 32  # the deepest legal body is 4 ({"inputs": {"text": [{"b64": ...}]}})
_INT64_MAX = 2 ** 63 - 1
_NONE = object()


# -- request bodies ----------------------------------------------------------------------------
def _decode_json_value(value: Any, where: str) -> Any:
    """JSON value -> bytes for strings ({"b64": ...} too); other types pass for dtype checks."""
    if isinstance(value, str):
        return value.encode("utf-8", errors="surrogatepass")
    if isinstance(value, dict):
        if set(value) == {"b64"} and isinstance(value["b64"], str):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except (ValueError, binascii.Error):
                raise invalid(f"{where}: 'b64' value is not valid base64.") from None
        raise invalid(f"{where}: expected a string, got an object with keys "
                      f"{clip(str(sorted(value)))}.")
    return value


def _to_array(values: list[Any], input_name: str) -> np.ndarray:
    if any(isinstance(v, list) for v in values):
        raise invalid(f"Input '{input_name}' must be a vector of strings, shape [batch]; got a "
                      "nested list (rank > 1). Send one string per instance.")
    if values and all(isinstance(v, bytes) for v in values):
        return np.array(values, dtype=object)
    bad = next((v for v in values if not isinstance(v, bytes)), _NONE)
    if bad is not _NONE:
        kind = {bool: "Bool", int: "Number", float: "Number", type(None): "Null"}.get(
            type(bad), type(bad).__name__)
        raise invalid(f"JSON Value: {clip(_dump(bad))} Type: {kind} is not of expected type: "
                      f"string (input '{clip(input_name)}').")
    return np.array(values, dtype=object)


def _dump(value: Any) -> str:
    try:
        return json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        return repr(value)


def _reject_constant(name: str) -> Any:
    raise invalid(f"JSON Parse error: {name} is not a JSON value.")


def _json_depth(value: Any, limit: int) -> int:
    """The nesting depth of a parsed JSON value, counting stops past `limit`."""
    depth, level = 0, [value]
    while level:
        depth += 1
        if depth > limit:
            return depth
        nxt = []
        for item in level:
            if isinstance(item, list):
                nxt.extend(v for v in item if isinstance(v, (list, dict)))
            elif isinstance(item, dict):
                nxt.extend(v for v in item.values() if isinstance(v, (list, dict)))
        level = nxt
    return depth - 1


def load_json(body: bytes) -> Any:
    """A request body as JSON, every way it can fail a 400 (INVALID_ARGUMENT)."""
    if not body.strip():
        raise invalid("The request body is empty; send a JSON object with 'instances' or "
                      "'inputs'.")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise invalid(f"The request body is not valid UTF-8 (byte {err.start}); JSON must be "
                      "UTF-8. Send binary strings as {\"b64\": \"...\"}.") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        raise invalid(f"JSON Parse error: {err.msg} at offset {err.pos}") from None
    except RecursionError:
        raise invalid(f"JSON Parse error: the body is nested deeper than {MAX_JSON_DEPTH} "
                      "levels.") from None
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        raise invalid(f"JSON Parse error: a value is out of range: {clip(str(err), 120)}"
                      ) from None
    if _json_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise invalid(f"JSON Parse error: the body is nested deeper than {MAX_JSON_DEPTH} "
                      "levels.")
    return value


def _load_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a predict body, its keys checked."""
    request = load_json(body)
    if not isinstance(request, dict):
        raise invalid("The request body must be a JSON object with 'instances' or 'inputs'.")
    unknown = [k for k in request if k not in _BODY_KEYS]
    if unknown:
        raise invalid(f"Unknown key '{clip(unknown[0])}' in the request body."
                      f"{closest(unknown[0], list(_BODY_KEYS))} "
                      f"Valid keys: {', '.join(_BODY_KEYS)}.")
    signature = request.get("signature_name", "")
    if not isinstance(signature, str):
        raise invalid(f"'signature_name' must be a string; got {clip(_dump(signature))}.")
    return request


def _parse_instances(instances: Any, input_names: list[str], max_batch: int | None = None
                     ) -> dict[str, np.ndarray]:
    """The row form: one element (a string, or an object naming the inputs) per example."""
    if not isinstance(instances, list):
        raise invalid("'instances' must be a JSON list, one element per example.")
    if max_batch is not None and len(instances) > max_batch:
        raise batch_too_large(len(instances), max_batch)
    columns: dict[str, list[Any]] = {}
    for i, instance in enumerate(instances):
        if isinstance(instance, dict) and not (set(instance) == {"b64"}):
            for key, value in instance.items():
                columns.setdefault(key, []).append(
                    _decode_json_value(value, f"instances[{i}].{key}"))
            missing = [n for n in input_names if n not in instance]
            if missing and not (set(instance) - set(input_names)):
                raise invalid(f"instances[{i}] is missing input '{clip(missing[0])}'.")
        else:
            if len(input_names) != 1:
                raise invalid("Each instance must be an object naming the inputs "
                              f"{input_names}.")
            columns.setdefault(input_names[0], []).append(
                _decode_json_value(instance, f"instances[{i}]"))
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise invalid("Every instance must name the same inputs.")
    if not instances:
        columns = {name: [] for name in input_names}
    return {k: _to_array(v, k) for k, v in columns.items()}


def _parse_inputs(inputs: Any, input_names: list[str], max_batch: int | None = None
                  ) -> dict[str, np.ndarray]:
    """The columnar form: a list per input, or one list when the signature has one input."""
    if isinstance(inputs, dict) and not set(inputs) == {"b64"}:
        named = inputs
    elif len(input_names) == 1:
        named = {input_names[0]: inputs}
    else:
        raise invalid(f"'inputs' must be an object naming the inputs {input_names}.")
    out = {}
    for key, value in named.items():
        if not isinstance(value, list):
            raise invalid(f"Input '{clip(key)}' must be a vector of strings, shape [batch]; "
                          "got a scalar. Wrap it in a list.")
        if max_batch is not None and len(value) > max_batch:
            raise batch_too_large(len(value), max_batch)
        out[key] = _to_array([_decode_json_value(v, f"inputs.{key}[{i}]")
                              for i, v in enumerate(value)], key)
    return out


def parse_rest_request(body: bytes | dict[str, Any], input_names: list[str],
                       max_batch: int | None = None) -> tuple[str, str, dict[str, np.ndarray]]:
    """Parses a TF Serving REST predict body (or its parsed JSON object) -> (format,
    signature_name, inputs); lists longer than `max_batch` are refused before they are read."""
    request = _load_body(body) if isinstance(body, (bytes, bytearray)) else body
    signature = request.get("signature_name", "")
    if "instances" in request and "inputs" in request:
        raise invalid("Request body should not contain both 'instances' and 'inputs' keys; "
                      "use one (row or columnar format).")
    if "instances" in request:
        return "row", signature, _parse_instances(request["instances"], input_names, max_batch)
    if "inputs" in request:
        return "columnar", signature, _parse_inputs(request["inputs"], input_names, max_batch)
    raise invalid("Missing 'inputs' or 'instances' key in the request body.")


# -- responses ---------------------------------------------------------------------------------
def _json_value(value: Any) -> Any:
    return to_python(value, errors="replace")


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


# -- the application ---------------------------------------------------------------------------
class RestApp:
    """TF Serving's REST URLs over a :class:`Predictor`: ``app(HttpRequest) -> HttpResponse``."""

    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            if request.method == "POST":
                return self._post(request)
            return self._get(request)
        except ServingError as err:
            if err.http_status >= 500:
                log.error("%s %s: %s %s", request.method, clip(request.target), err.code,
                          err.message)
            return error_response(err.http_status, err.message)
        except Exception as err:  # noqa: BLE001 - a fault of the server: logged, 500
            log.exception("%s %s failed", request.method, clip(request.target))
            return error_response(500, f"Internal error: {type(err).__name__}: "
                                       f"{clip(str(err), 300)}")

    @staticmethod
    def _route(request: HttpRequest) -> tuple[str, int | None, str | None, str]:
        match = _URL.match(request.path)
        if not match:
            raise ServingError("NOT_FOUND", f"Malformed request: {request.method} "
                                            f"{clip(request.target, 200)}")
        version = match.group("version")
        if version is not None:
            if not re.fullmatch(r"[0-9]{1,19}", version) or int(version) > _INT64_MAX:
                raise invalid(f"Model version must be a non-negative 64-bit integer; got "
                              f"'{clip(version)}'.")
            version = int(version)
        return match.group("name"), version, match.group("label"), match.group("rest") or ""

    def _get(self, request: HttpRequest) -> HttpResponse:
        from google.protobuf import json_format

        name, version, label, rest = self._route(request)
        manager = self.predictor.manager
        if rest == "/metadata":
            with manager.lease(name, version, label) as servable:
                signatures = json_format.MessageToDict(signature_def_map(servable),
                                                       preserving_proto_field_name=True)
            return json_response(200, {
                "model_spec": {"name": name, "signature_name": "",
                               "version": str(servable.version)},
                "metadata": {"signature_def": signatures}})
        if rest == "":
            status = model_status_proto(manager, name, version, label)
            return json_response(200, json_format.MessageToDict(
                status, preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True))
        raise ServingError("NOT_FOUND", f"Malformed request: GET {clip(request.target, 200)}")

    def _post(self, request: HttpRequest) -> HttpResponse:
        name, version, label, rest = self._route(request)
        if rest != ":predict":
            if rest in (":classify", ":regress"):
                raise invalid(f"{rest[1:]} is not supported: this model has predict "
                              "signatures only; POST to :predict.")
            raise ServingError("NOT_FOUND", f"Malformed request: POST {clip(request.target, 200)}")
        body = _load_body(request.body)
        with self.predictor.manager.lease(name, version, label) as servable:
            key = signature_or_default(body.get("signature_name", ""), servable)
            fmt, signature, inputs = parse_rest_request(
                body, list(servable.signature_inputs(key)), servable.max_batch_size)
            _, outputs = self.predictor.run(servable, signature, inputs)
        return json_response(200, format_rest_response(fmt, outputs))


def make_rest_server(host: str, port: int, predictor: Predictor,
                     limits: HttpLimits | None = None) -> PooledHTTPServer:
    """A bound (not yet started) HTTP server answering TF Serving's REST API with `predictor`.

    ``server.start()`` serves; ``server.close(drain_timeout)`` drains and stops.
    """
    return PooledHTTPServer((host, port), RestApp(predictor), limits or HttpLimits())
