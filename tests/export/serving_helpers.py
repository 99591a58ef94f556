"""Helpers shared by the serving robustness tests: raw HTTP, REST and gRPC calls, copies of the
session's tiny export, process measurements (threads, RSS)."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

MODEL = "translate"
PREDICT = f"/v1/models/{MODEL}:predict"
SENTENCES = ["I love you.", "God saw the light.", "", "我爱你"]
# Sentences that take every featuriser path (the parity tests: evaluation, SavedModel, CT2).
LONG = " ".join(["In the beginning God created the heavens and the earth."] * 4)
HARD_SENTENCES = [
    "I love you.",
    "The Lord is my shepherd; I shall not want.",
    "Where is the house of my father?",
    LONG,                      # over the export's input limit: truncated on every path
    "我爱你",                   # CJK
    "ᚠᚢᚦ ᚨᚱᚲ",                 # only pieces the vocabulary does not know
    "Peace be with you, my friend.",
]


def copy_version(version_dir: Path, base: Path, version: int, atomic: bool = True) -> Path:
    """Copies an export's version directory to ``<base>/translate/<version>`` (renamed into
    place when `atomic`, as ``aiayn export`` publishes)."""
    model_dir = base / MODEL
    model_dir.mkdir(parents=True, exist_ok=True)
    target = model_dir / str(version)
    if not atomic:
        shutil.copytree(version_dir, target)
        return target
    tmp = model_dir / f".tmp-{version}-{uuid.uuid4().hex[:6]}"
    shutil.copytree(version_dir, tmp)
    tmp.rename(target)
    return target


def rss_mb() -> float:
    """This process's resident set size (MB), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def raw_http(port: int, data: bytes, timeout: float = 10.0) -> tuple[int, dict, dict]:
    """Sends raw bytes, reads the answer to EOF -> (status, headers, JSON body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_http_answer(sock)


def read_http_answer(sock: socket.socket) -> tuple[int, dict, dict]:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    data = b"".join(chunks)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return status, headers, json.loads(body) if body else {}


def post(port: int, path: str, body, timeout: float = 60.0) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def get(port: int, path: str, timeout: float = 60.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                    timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def rest_translate(port: int, texts, path: str = PREDICT) -> list[str]:
    status, body = post(port, path, {"instances": list(texts)})
    assert status == 200, body
    return [p["translation"] for p in body["predictions"]]


def grpc_request(texts=(), name: str = MODEL, version: int | None = None,
                 label: str | None = None, signature: str = ""):
    from tensorflow_serving.apis import predict_pb2

    from aiayn.export.codec import texts_proto

    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    if signature:
        request.model_spec.signature_name = signature
    request.inputs["text"].CopyFrom(texts_proto(list(texts)))
    return request


class Grpc:
    """A raw gRPC stub pair; ``call(method, request) -> (code name, response or details)``."""

    def __init__(self, port: int):
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)])
        self.predict_stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.model_stub = model_service_pb2_grpc.ModelServiceStub(self.channel)

    def call(self, method, request, timeout: float = 60.0):
        import grpc

        try:
            return "OK", method(request, timeout=timeout)
        except grpc.RpcError as err:
            return err.code().name, err.details()

    def predict(self, request, timeout: float = 60.0):
        return self.call(self.predict_stub.Predict, request, timeout)

    def translate(self, texts, **spec) -> tuple[list[str], int]:
        code, response = self.predict(grpc_request(texts, **spec))
        assert code == "OK", response
        import tensorflow as tf

        values = tf.make_ndarray(response.outputs["translation"]).tolist()
        return [v.decode("utf-8") for v in values], response.model_spec.version.value

    def status(self, name: str = MODEL, version: int | None = None, label: str | None = None):
        from tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        if version is not None:
            request.model_spec.version.value = version
        if label is not None:
            request.model_spec.version_label = label
        return self.call(self.model_stub.GetModelStatus, request)

    def close(self) -> None:
        self.channel.close()


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Polls `predicate` until it returns a truthy value (returned) or fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class ThreadSampler:
    """Samples threading.active_count() every `interval` s in the background; ``.max``."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.max = threading.active_count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.max = max(self.max, threading.active_count())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
