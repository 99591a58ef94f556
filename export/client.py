"""Clients for the translation servable: TF Serving REST, TF Serving gRPC, or a local export.

All three answer ``translate(texts) -> list[Translation]``; they work the same against
``tensorflow_model_server`` and the development server. Payloads are encoded and decoded with
:mod:`aiayn.export.codec`, which the development server shares.

    client = connect("http://127.0.0.1:8501")          # REST
    client = connect("grpc://127.0.0.1:8500")          # gRPC
    client = connect("exports/translate")              # a local export (latest version)
    client.translate(["I love you."])[0].text
"""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.export.codec import protos_to_python, tensors_to_python, texts_proto, texts_tensor
from aiayn.export.saved_model import (
    NBEST_SIGNATURE,
    SAMPLES_FILE,
    SERVING_SIGNATURE,
    list_versions,
)


class ServingClientError(RuntimeError):
    """The server answered with an error (``code``: HTTP status or gRPC status name)."""

    def __init__(self, code: Any, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True)
class Translation:
    """One translated sentence: the best ``text`` and its ``score``; ``n_best`` when asked.

    With ``n_best``, also what the ``n_best`` signature says of the input: ``truncated`` (over
    the export's token limit) and ``unknown_fraction`` (the share of its characters the
    vocabulary does not know; None where the signature does not say, e.g. ``serving_default``).
    """

    text: str
    score: float
    n_best: tuple[tuple[str, float], ...] = ()
    truncated: bool = False
    unknown_fraction: float | None = None


def _to_translations(outputs: dict[str, Any], n_best: bool) -> list[Translation]:
    if not n_best:
        return [Translation(text=t, score=float(s))
                for t, s in zip(outputs["translation"], outputs["score"])]
    result = []
    truncated = outputs.get("truncated") or [False] * len(outputs["translations"])
    # Exports made before the output existed lack it: None, "not known".
    unknown = outputs.get("unknown_fraction") or [None] * len(outputs["translations"])
    for texts, scores, cut, unk in zip(outputs["translations"], outputs["scores"], truncated,
                                       unknown):
        pairs = tuple((t, float(s)) for t, s in zip(texts, scores))
        result.append(Translation(text=pairs[0][0], score=pairs[0][1], n_best=pairs,
                                  truncated=bool(cut),
                                  unknown_fraction=None if unk is None else float(unk)))
    return result


class RestClient:
    """TF Serving REST API client (``/v1/models/<name>[/versions/<v>]``).

    Args:
      url: server root, e.g. ``http://127.0.0.1:8501``.
      model_name: servable name.
      version: a specific version, or None for the latest.
      timeout: seconds per request.
    """

    def __init__(self, url: str = "http://127.0.0.1:8501", model_name: str = "translate",
                 version: int | None = None, timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.model_name = model_name
        self.version = version
        self.timeout = timeout

    def _model_url(self) -> str:
        url = f"{self.url}/v1/models/{self.model_name}"
        return url + (f"/versions/{self.version}" if self.version is not None else "")

    def _request(self, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            payload = err.read()
            try:
                message = json.loads(payload).get("error", payload.decode("utf-8", "replace"))
            except ValueError:
                message = payload.decode("utf-8", "replace")
            raise ServingClientError(err.code, message) from None

    def predict(self, texts: Sequence[str], signature_name: str = SERVING_SIGNATURE,
                columnar: bool = True) -> dict[str, Any]:
        """Raw predict; returns ``{output: values}`` whichever request format is used."""
        body: dict[str, Any] = {"signature_name": signature_name}
        if columnar:
            body["inputs"] = {"text": list(texts)}
            return self._request(self._model_url() + ":predict", body)["outputs"]
        body["instances"] = [{"text": t} for t in texts]
        rows = self._request(self._model_url() + ":predict", body)["predictions"]
        keys = rows[0].keys() if rows else ()
        return {k: [row[k] for row in rows] for k in keys}

    def translate(self, texts: Sequence[str], n_best: bool = False) -> list[Translation]:
        if not texts:
            return []
        return _to_translations(
            self.predict(texts, NBEST_SIGNATURE if n_best else SERVING_SIGNATURE), n_best)

    def status(self) -> dict[str, Any]:
        return self._request(self._model_url())

    def metadata(self) -> dict[str, Any]:
        return self._request(self._model_url() + "/metadata")


class GrpcClient:
    """TF Serving gRPC client (``PredictionService``, ``ModelService``).

    Args:
      target: ``host:port``, e.g. ``127.0.0.1:8500``.
      model_name, version, timeout: as for :class:`RestClient`.
    """

    def __init__(self, target: str = "127.0.0.1:8500", model_name: str = "translate",
                 version: int | None = None, timeout: float = 120.0):
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        self.target = target.removeprefix("grpc://")
        self.model_name = model_name
        self.version = version
        self.timeout = timeout
        self._channel = grpc.insecure_channel(self.target)
        self._predict = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._models = model_service_pb2_grpc.ModelServiceStub(self._channel)

    def _spec(self, spec, signature_name: str | None = None) -> None:
        spec.name = self.model_name
        if self.version is not None:
            spec.version.value = self.version
        if signature_name:
            spec.signature_name = signature_name

    def _call(self, method, request):
        import grpc

        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as err:
            raise ServingClientError(err.code().name, err.details()) from None

    def predict(self, texts: Sequence[str], signature_name: str = SERVING_SIGNATURE
                ) -> dict[str, Any]:
        from tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        self._spec(request.model_spec, signature_name)
        request.inputs["text"].CopyFrom(texts_proto(texts))
        response = self._call(self._predict.Predict, request)
        return protos_to_python(response.outputs)

    def translate(self, texts: Sequence[str], n_best: bool = False) -> list[Translation]:
        if not texts:
            return []
        return _to_translations(
            self.predict(texts, NBEST_SIGNATURE if n_best else SERVING_SIGNATURE), n_best)

    def status(self):
        from tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        self._spec(request.model_spec)
        return self._call(self._models.GetModelStatus, request)

    def metadata(self):
        from tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest()
        self._spec(request.model_spec)
        request.metadata_field.append("signature_def")
        return self._call(self._predict.GetModelMetadata, request)

    def close(self) -> None:
        self._channel.close()


class LocalClient:
    """Translates with an export loaded in this process (no server).

    Args:
      path: a version directory, or a model directory (its latest version is used).
    """

    def __init__(self, path: str | os.PathLike):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  registers the SentencePiece ops

        path = Path(path)
        if not (path / "saved_model.pb").exists():
            versions = list_versions(path)
            if not versions:
                raise FileNotFoundError(f"No SavedModel in {path} (and no integer version "
                                        "directories under it).")
            path = path / str(versions[-1])
        self.path = path
        self._loaded = tf.saved_model.load(str(path))
        self._tokenizer = None  # loaded on the first unknown_fractions() call

    def predict(self, texts: Sequence[str], signature_name: str = SERVING_SIGNATURE
                ) -> dict[str, Any]:
        fn = self._loaded.signatures[signature_name]
        return tensors_to_python(fn(text=texts_tensor(texts)))

    def translate(self, texts: Sequence[str], n_best: bool = False) -> list[Translation]:
        if not texts:
            return []
        return _to_translations(
            self.predict(texts, NBEST_SIGNATURE if n_best else SERVING_SIGNATURE), n_best)

    def unknown_fractions(self, texts: Sequence[str]) -> list[float | None]:
        """What the ``n_best`` signature's ``unknown_fraction`` says of ``texts``, without a
        search: the export's own SentencePiece model (``assets.extra/spm.model``) through the
        one source featuriser, the function the exported graph runs, over the pieces the graph
        translates (its ``protect_pattern``, from ``assets.extra/verify_samples.json``). None
        for each text when the export has no ``spm.model``.
        """
        if not texts:
            return []
        if self._tokenizer is None:
            spm_path = self.path / "assets.extra" / "spm.model"
            if not spm_path.is_file():
                return [None] * len(texts)
            from aiayn.models.tokenizer import SubwordTokenizer

            self._tokenizer = SubwordTokenizer.from_file(spm_path)
        import tensorflow as tf

        from aiayn.models.protect import rows_unknown_fraction, split_protected

        text = texts_tensor(texts)
        pattern = self._protect_pattern()
        if pattern:
            segments = split_protected(text, pattern)
            text = tf.boolean_mask(segments.pieces.flat_values, segments.translate.flat_values)
        # The fraction is of the whole piece, whatever the limit (1: no padding work).
        fractions = self._tokenizer.featurize_source(text, 1).unknown_fraction
        if pattern:
            fractions = rows_unknown_fraction(segments, text, fractions)
        return [float(f) for f in fractions.numpy()]

    def _protect_pattern(self) -> str:
        """The export's ``protect_pattern`` ("" for exports made before protected spans)."""
        samples = self.path / "assets.extra" / SAMPLES_FILE
        if not samples.is_file():
            return ""
        options = json.loads(samples.read_text(encoding="utf-8")).get("options", {})
        return options.get("protect_pattern", "")


def connect(target: str, model_name: str = "translate", version: int | None = None,
            timeout: float = 120.0):
    """A client for ``target``: ``http(s)://...`` REST, ``grpc://host:port`` gRPC, else a path."""
    if target.startswith(("http://", "https://")):
        return RestClient(target, model_name, version, timeout)
    if target.startswith("grpc://"):
        return GrpcClient(target, model_name, version, timeout)
    path = Path(target)
    if path.exists():
        if version is not None and (path / str(version)).exists():
            path = path / str(version)
        elif (path / model_name).is_dir() and not list_versions(path):
            path = path / model_name  # an export base dir
        return LocalClient(path)
    raise ValueError(f"Cannot tell what {target!r} is: use http://host:8501 (REST), "
                     "grpc://host:8500 (gRPC) or the path of an export directory.")
