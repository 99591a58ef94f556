"""The development server's REST front end (TF Serving's REST API).

Parses predict bodies in both of TF Serving's forms (:func:`parse_rest_request`: row
``{"instances": [...]}`` and columnar ``{"inputs": ...}``, strings as JSON strings or
``{"b64": ...}``), formats the matching response (:func:`format_rest_response`), and serves
the URLs below with :class:`RestHandler` (:func:`make_rest_server` binds it)::

    POST /v1/models/<name>[/versions/<v>]:predict
    GET  /v1/models/<name>[/versions/<v>]           model status
    GET  /v1/models/<name>[/versions/<v>]/metadata  signature defs

Errors are ``{"error": "..."}`` with the HTTP status of their TF Serving code.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping

import numpy as np

from aiayn.export.codec import to_python
from aiayn.export.predictor import Predictor, signature_or_default
from aiayn.export.servables import model_status_proto, signature_def_map
from aiayn.export.serving_errors import ServingError, closest, invalid

log = logging.getLogger("aiayn.export.server")

_URL = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?"
                  r"(?:/labels/(?P<label>[^/:]+))?(?P<rest>/metadata|:[a-zA-Z]+)?/?$")
_BODY_KEYS = ("signature_name", "instances", "inputs")


# -- request bodies ----------------------------------------------------------------------------
def _decode_json_value(value: Any, where: str) -> Any:
    """JSON value -> bytes for strings ({"b64": ...} too); other types pass for dtype checks."""
    if isinstance(value, str):
        return value.encode("utf-8", errors="surrogatepass")
    if isinstance(value, dict):
        if set(value) == {"b64"} and isinstance(value["b64"], str):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except ValueError:
                raise invalid(f"{where}: 'b64' value is not valid base64.") from None
        raise invalid(f"{where}: expected a string, got an object with keys {sorted(value)}.")
    return value


def _to_array(values: list[Any], input_name: str) -> np.ndarray:
    if any(isinstance(v, list) for v in values):
        raise invalid(f"Input '{input_name}' must be a vector of strings, shape [batch]; got a "
                      "nested list (rank > 1). Send one string per instance.")
    if values and all(isinstance(v, bytes) for v in values):
        return np.array(values, dtype=object)
    bad = next((v for v in values if not isinstance(v, bytes)), None)
    if bad is not None:
        kind = {bool: "Bool", int: "Number", float: "Number", type(None): "Null"}.get(
            type(bad), type(bad).__name__)
        raise invalid(f"JSON Value: {json.dumps(bad)} Type: {kind} is not of expected type: "
                      f"string (input '{input_name}').")
    return np.array(values, dtype=object)


def _load_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a predict body, its keys checked."""
    try:
        request = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise invalid(f"The request body is not valid UTF-8 (byte {err.start}); JSON must be "
                      "UTF-8. Send binary strings as {\"b64\": \"...\"}.") from None
    except json.JSONDecodeError as err:
        raise invalid(f"JSON Parse error: {err.msg} at offset {err.pos}") from None
    if not isinstance(request, dict):
        raise invalid("The request body must be a JSON object with 'instances' or 'inputs'.")
    unknown = [k for k in request if k not in _BODY_KEYS]
    if unknown:
        raise invalid(f"Unknown key '{unknown[0]}' in the request body."
                      f"{closest(unknown[0], list(_BODY_KEYS))} "
                      f"Valid keys: {', '.join(_BODY_KEYS)}.")
    return request


def _parse_instances(instances: Any, input_names: list[str]) -> dict[str, np.ndarray]:
    """The row form: one element (a string, or an object naming the inputs) per example."""
    if not isinstance(instances, list):
        raise invalid("'instances' must be a JSON list, one element per example.")
    columns: dict[str, list[Any]] = {}
    for i, instance in enumerate(instances):
        if isinstance(instance, dict) and not (set(instance) == {"b64"}):
            for key, value in instance.items():
                columns.setdefault(key, []).append(
                    _decode_json_value(value, f"instances[{i}].{key}"))
            missing = [n for n in input_names if n not in instance]
            if missing and not (set(instance) - set(input_names)):
                raise invalid(f"instances[{i}] is missing input '{missing[0]}'.")
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


def _parse_inputs(inputs: Any, input_names: list[str]) -> dict[str, np.ndarray]:
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
            raise invalid(f"Input '{key}' must be a vector of strings, shape [batch]; got "
                          "a scalar. Wrap it in a list.")
        out[key] = _to_array([_decode_json_value(v, f"inputs.{key}[{i}]")
                              for i, v in enumerate(value)], key)
    return out


def parse_rest_request(body: bytes, input_names: list[str]
                       ) -> tuple[str, str, dict[str, np.ndarray]]:
    """Parses a TF Serving REST predict body -> (format, signature_name, inputs)."""
    request = _load_body(body)
    signature = request.get("signature_name", "")
    if not isinstance(signature, str):
        raise invalid("'signature_name' must be a string.")
    if "instances" in request and "inputs" in request:
        raise invalid("Request body should not contain both 'instances' and 'inputs' keys; "
                      "use one (row or columnar format).")
    if "instances" in request:
        return "row", signature, _parse_instances(request["instances"], input_names)
    if "inputs" in request:
        return "columnar", signature, _parse_inputs(request["inputs"], input_names)
    raise invalid("Missing 'inputs' or 'instances' key in the request body.")


def signature_hint(body: bytes) -> str:
    """The signature_name of a body, if it parses (for input names); '' otherwise."""
    try:
        value = json.loads(body.decode("utf-8")).get("signature_name", "")
        return value if isinstance(value, str) else ""
    except (ValueError, AttributeError):
        return ""


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


# -- the handler -------------------------------------------------------------------------------
class RestHandler(BaseHTTPRequestHandler):
    """TF Serving's REST URLs over a :class:`Predictor` (set on a subclass: ``predictor``)."""

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
                raise invalid(f"Model version must be an integer; got '{version}'.")
            version = int(version)
        if match.group("label"):
            raise ServingError("UNIMPLEMENTED", "Version labels are not supported by the "
                                                "development server; use /versions/<v>.")
        return match.group("name"), version, match.group("rest") or ""

    def _handle(self, method: str, serve) -> None:
        """Runs ``serve()``; any error becomes TF Serving's error reply, the server stays up."""
        try:
            serve()
        except ServingError as err:
            self._error(err)
        except Exception as err:  # noqa: BLE001 - the server stays up
            log.exception("%s %s failed", method, self.path)
            self._error(ServingError("INTERNAL", str(err)))

    def do_GET(self) -> None:  # noqa: N802
        self._handle("GET", self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST", self._post)

    def _get(self) -> None:
        from google.protobuf import json_format

        name, version, rest = self._route("GET")
        manager = self.predictor.manager
        if rest == "/metadata":
            servable = manager.get(name, version)
            self._send(200, {
                "model_spec": {"name": name, "signature_name": "",
                               "version": str(servable.version)},
                "metadata": {"signature_def": json_format.MessageToDict(
                    signature_def_map(servable), preserving_proto_field_name=True)}})
        elif rest == "":
            status = model_status_proto(manager, name, version)
            self._send(200, json_format.MessageToDict(
                status, preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True))
        else:
            raise ServingError("NOT_FOUND", f"Malformed request: GET {self.path}")

    def _post(self) -> None:
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


class _HTTPServer(ThreadingHTTPServer):
    # The default listen backlog (5) resets connections under 32 concurrent clients.
    request_queue_size = 256
    daemon_threads = True


def make_rest_server(host: str, port: int, predictor: Predictor) -> ThreadingHTTPServer:
    """A bound (not yet serving) HTTP server answering TF Serving's REST API with `predictor`."""
    handler = type("Handler", (RestHandler,), {"predictor": predictor})
    return _HTTPServer((host, port), handler)
