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

The pieces, one module each: :mod:`aiayn.export.serving_errors` (TF Serving's status codes),
:mod:`aiayn.export.batcher` (request batching), :mod:`aiayn.export.servables` (loaded versions
and the version poller), :mod:`aiayn.export.predictor` (validation and Predict, shared by both
front ends), :mod:`aiayn.export.rest` and :mod:`aiayn.export.grpc_api` (the front ends);
payloads are encoded with :mod:`aiayn.export.codec`, as the clients do. This module wires them
together in :class:`DevServer`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from aiayn.export.predictor import Predictor
from aiayn.export.rest import make_rest_server
from aiayn.export.servables import ModelManager

log = logging.getLogger("aiayn.export.server")


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
            self._http = make_rest_server(self.host, self.rest_port, self.predictor)
            self.rest_port = self._http.server_address[1]
            threading.Thread(target=self._http.serve_forever, name="rest", daemon=True).start()
        if self.grpc_port is not None:
            import grpc

            from aiayn.export.grpc_api import add_grpc_services

            self._grpc = grpc.server(concurrent.futures.ThreadPoolExecutor(self.threads))
            add_grpc_services(self.predictor, self._grpc)
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
