"""The development server's gRPC front end (TF Serving's gRPC API).

:class:`PredictionService` (``tensorflow.serving.PredictionService``: ``Predict``,
``GetModelMetadata``) and :class:`ModelService` (``tensorflow.serving.ModelService``:
``GetModelStatus``) over a :class:`~aiayn.export.predictor.Predictor`; errors abort the call
with the gRPC status code of their TF Serving code. :func:`add_grpc_services` registers both on
a ``grpc.Server``; :func:`make_grpc_server` builds one with bounded threads, a bounded number of
concurrent calls and a maximum message size.

A Predict input is checked from its header before any value is read
(:func:`tensor_proto_texts`): dtype ``DT_STRING``, rank 1, a known, non-negative size within
the batch limit, and exactly that many ``string_val`` elements. A tensor that declares 50
million strings and carries one is refused at once with ``INVALID_ARGUMENT``; nothing of its
declared size is allocated. Versions are named by number (``model_spec.version``) or by label
(``model_spec.version_label``, from ``models.config``).

This module imports ``grpc`` and ``tensorflow_serving`` when it is imported: the server imports
it only when a gRPC port is asked for.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable

import grpc
import numpy as np
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from aiayn.export.codec import array_to_proto
from aiayn.export.manager import model_status_proto
from aiayn.export.predictor import (
    Predictor,
    batch_too_large,
    input_name_of,
    not_a_vector,
    not_strings,
    signature_or_default,
)
from aiayn.export.servables import signature_def_map
from aiayn.export.serving_errors import HTTP_STATUS, ServingError, clip, invalid

log = logging.getLogger("aiayn.export.server")

_CODES = {name: getattr(grpc.StatusCode, name) for name in HTTP_STATUS}


def _abort(context, err: ServingError):
    context.abort(_CODES.get(err.code, grpc.StatusCode.INTERNAL), err.message)


def _guarded(method: str, context, call: Callable[[], object]):
    """Runs `call`; a ServingError aborts with its code, anything else is a logged INTERNAL."""
    try:
        return call()
    except ServingError as err:
        error = err
        if err.http_status >= 500:
            log.error("gRPC %s: %s %s", method, err.code, err.message)
    except Exception as err:  # noqa: BLE001 - a fault of the server: logged, INTERNAL
        log.exception("gRPC %s failed", method)
        error = ServingError("INTERNAL", f"Internal error: {type(err).__name__}: "
                                         f"{clip(str(err), 300)}")
    _abort(context, error)


def _spec_choice(spec) -> tuple[int | None, str | None]:
    """(version, label) of a ModelSpec: at most one of them is set."""
    choice = spec.WhichOneof("version_choice")
    if choice == "version":
        return spec.version.value, None
    if choice == "version_label":
        return None, spec.version_label
    return None, None


def _dtype_name(dtype: int) -> str:
    try:
        return types_pb2.DataType.Name(dtype)
    except ValueError:
        return f"dtype {dtype}"


def tensor_proto_texts(proto, input_name: str, max_batch: int) -> np.ndarray:
    """A string input's values as an object array of bytes, after checking its header.

    The dtype, rank, declared size (against the batch limit and the number of values sent)
    are checked before anything is materialised; each failure is INVALID_ARGUMENT.
    """
    shape = proto.tensor_shape
    if shape.unknown_rank:
        raise invalid(f"Input '{clip(input_name)}' has an unknown rank; send tensor_shape "
                      "{ dim { size: N } } with N strings.")
    if proto.dtype != types_pb2.DT_STRING:
        raise not_strings(input_name, _dtype_name(proto.dtype))
    dims = [d.size for d in shape.dim]
    if len(dims) != 1:
        raise not_a_vector(input_name, dims)
    (size,) = dims
    if size < 0:
        raise invalid(f"Input '{clip(input_name)}' declares a negative size ({size}).")
    if size > max_batch:
        raise batch_too_large(size, max_batch)
    if proto.tensor_content:
        raise invalid(f"Input '{clip(input_name)}': DT_STRING values go in string_val, not "
                      "tensor_content.")
    if len(proto.string_val) != size:
        raise invalid(f"Input '{clip(input_name)}' declares shape [{size}] but carries "
                      f"{len(proto.string_val)} string(s); the shape must count the values "
                      "sent.")
    return np.array(list(proto.string_val), dtype=object).reshape(size)


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``Predict`` and ``GetModelMetadata``."""

    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def Predict(self, request, context):  # noqa: N802
        return _guarded("Predict", context, lambda: self._predict(request))

    def _predict(self, request):
        spec = request.model_spec
        version, label = _spec_choice(spec)
        with self.predictor.manager.lease(spec.name, version, label) as servable:
            key = signature_or_default(spec.signature_name, servable)
            input_name = input_name_of(request.inputs.keys(),
                                       list(servable.signature_inputs(key)))
            texts = tensor_proto_texts(request.inputs[input_name], input_name,
                                       servable.max_batch_size)
            outputs_spec = servable.signature_outputs(key)
            unknown = [n for n in request.output_filter if n not in outputs_spec]
            if unknown:
                raise invalid(f"output tensor alias not found in signature: {clip(unknown[0])} "
                              f"Outputs expected to be in the set {sorted(outputs_spec)}.")
            _, outputs = self.predictor.run(servable, key, {input_name: texts})
        response = predict_pb2.PredictResponse()
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        response.model_spec.signature_name = key
        wanted = set(request.output_filter) or set(outputs)
        for name, value in outputs.items():
            if name in wanted:
                response.outputs[name].CopyFrom(array_to_proto(value))
        return response

    def GetModelMetadata(self, request, context):  # noqa: N802
        return _guarded("GetModelMetadata", context, lambda: self._metadata(request))

    def _metadata(self, request):
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise invalid("Metadata field signature_def must be requested (and only it); got "
                          f"{clip(str(fields))}.")
        version, label = _spec_choice(request.model_spec)
        with self.predictor.manager.lease(request.model_spec.name, version, label) as servable:
            signatures = signature_def_map(servable)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        response.metadata["signature_def"].Pack(signatures)
        return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """``GetModelStatus``."""

    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def GetModelStatus(self, request, context):  # noqa: N802
        version, label = _spec_choice(request.model_spec)
        return _guarded("GetModelStatus", context, lambda: model_status_proto(
            self.predictor.manager, request.model_spec.name, version, label))


def add_grpc_services(predictor: Predictor, server: grpc.Server) -> None:
    """Registers PredictionService and ModelService over `predictor` on `server`."""
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(predictor), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(predictor), server)


def make_grpc_server(predictor: Predictor, workers: int, max_message_bytes: int,
                     max_concurrent_rpcs: int) -> grpc.Server:
    """A gRPC server with both services: `workers` threads, at most `max_concurrent_rpcs`
    calls at once (more get RESOURCE_EXHAUSTED) and messages of at most `max_message_bytes`
    (larger ones get RESOURCE_EXHAUSTED before they are parsed)."""
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                              thread_name_prefix="grpc-worker"),
        options=[("grpc.max_receive_message_length", int(max_message_bytes)),
                 ("grpc.max_send_message_length", -1)],
        maximum_concurrent_rpcs=max_concurrent_rpcs)
    add_grpc_services(predictor, server)
    return server
