"""The development server's gRPC front end (TF Serving's gRPC API).

:class:`PredictionService` (``tensorflow.serving.PredictionService``: ``Predict``,
``GetModelMetadata``) and :class:`ModelService` (``tensorflow.serving.ModelService``:
``GetModelStatus``) over a :class:`~aiayn.export.predictor.Predictor`; errors abort the call
with the gRPC status code of their TF Serving code. :func:`add_grpc_services` registers both on
a ``grpc.Server``.

This module imports ``grpc`` and ``tensorflow_serving`` when it is imported: the server imports
it only when a gRPC port is asked for.
"""

from __future__ import annotations

import grpc
from tensorflow_serving.apis import (get_model_metadata_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)

from aiayn.export.codec import array_to_proto, proto_to_array
from aiayn.export.predictor import Predictor
from aiayn.export.servables import model_status_proto, signature_def_map
from aiayn.export.serving_errors import HTTP_STATUS, ServingError, invalid

_CODES = {name: getattr(grpc.StatusCode, name) for name in HTTP_STATUS}


def _abort(context, err: ServingError):
    context.abort(_CODES.get(err.code, grpc.StatusCode.INTERNAL), err.message)


def _spec_version(spec) -> int | None:
    return spec.version.value if spec.HasField("version") else None


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``Predict`` and ``GetModelMetadata``."""

    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def Predict(self, request, context):  # noqa: N802
        try:
            inputs = {key: proto_to_array(proto) for key, proto in request.inputs.items()}
            servable, key, outputs = self.predictor.predict(
                request.model_spec.name, _spec_version(request.model_spec),
                request.model_spec.signature_name, inputs)
            response = predict_pb2.PredictResponse()
            response.model_spec.name = servable.name
            response.model_spec.version.value = servable.version
            response.model_spec.signature_name = key
            wanted = set(request.output_filter) or set(outputs)
            for name, value in outputs.items():
                if name in wanted:
                    response.outputs[name].CopyFrom(array_to_proto(value))
            return response
        except ServingError as err:
            _abort(context, err)
        except (TypeError, ValueError) as err:
            _abort(context, invalid(f"Could not read the input tensor: {err}"))

    def GetModelMetadata(self, request, context):  # noqa: N802
        try:
            fields = list(request.metadata_field)
            if fields != ["signature_def"]:
                raise invalid("Metadata field signature_def must be requested (and only "
                              f"it); got {fields}.")
            servable = self.predictor.manager.get(request.model_spec.name,
                                                  _spec_version(request.model_spec))
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = servable.name
            response.model_spec.version.value = servable.version
            response.metadata["signature_def"].Pack(signature_def_map(servable))
            return response
        except ServingError as err:
            _abort(context, err)


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    """``GetModelStatus``."""

    def __init__(self, predictor: Predictor):
        self.predictor = predictor

    def GetModelStatus(self, request, context):  # noqa: N802
        try:
            return model_status_proto(self.predictor.manager, request.model_spec.name,
                                      _spec_version(request.model_spec))
        except ServingError as err:
            _abort(context, err)


def add_grpc_services(predictor: Predictor, server: grpc.Server) -> None:
    """Registers PredictionService and ModelService over `predictor` on `server`."""
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(predictor), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(predictor), server)
