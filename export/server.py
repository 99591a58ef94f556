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

Like TF Serving it polls the base directory and ``models.config`` and serves the versions each
model's ``model_version_policy`` asks for (latest 1 by default; latest N, specific, all) under
their ``version_labels``; a new version is loaded and warmed up from ``assets.extra/
tf_serving_warmup_requests`` before it takes traffic, the old one finishes the requests it
accepted, and a version that fails to load is retried with back-off and shown, with its error,
in the model status. Concurrent requests are batched: a queue per signature merges requests up
to ``max_batch_size`` rows or ``batch_timeout_ms``.

Errors never stop the server; REST errors are ``{"error": "..."}`` with TF Serving's status
codes (INVALID_ARGUMENT -> 400, NOT_FOUND -> 404, ...), gRPC errors the matching status code.
Its resources are bounded whatever the clients do (:class:`~aiayn.export.http_server.HttpLimits`
and the gRPC options): ``threads`` workers per API, ``max_connections`` open REST connections
and concurrent gRPC calls, ``max_request_bytes`` per request, ``header_timeout`` and
``read_timeout`` to receive a REST request. :meth:`DevServer.serve_forever` stops on SIGTERM or
Ctrl-C by draining: no new connections, requests in flight answered (``drain_timeout`` at most).

Example::

    server = DevServer("exports", rest_port=8501, grpc_port=8500)
    server.start()          # returns at once; server.rest_port / server.grpc_port are bound
    ...
    server.stop()

The pieces, one module each: :mod:`aiayn.export.serving_errors` (TF Serving's status codes),
:mod:`aiayn.export.batcher` (request batching), :mod:`aiayn.export.servables` (a loaded version),
:mod:`aiayn.export.manager` (the version manager), :mod:`aiayn.export.model_config`
(``models.config``),
:mod:`aiayn.export.predictor` (validation and Predict, shared by both front ends),
:mod:`aiayn.export.http_server` (the bounded HTTP server), :mod:`aiayn.export.rest` and
:mod:`aiayn.export.grpc_api` (the front ends);
payloads are encoded with :mod:`aiayn.export.codec`, as the clients do. This module wires them
together in :class:`DevServer`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

from aiayn.export.http_server import HttpLimits, PooledHTTPServer
from aiayn.export.manager import ModelManager
from aiayn.export.predictor import Predictor
from aiayn.export.rest import make_rest_server

log = logging.getLogger("aiayn.export.server")

# Defaults (README "Serving" states them; `aiayn serve` has a flag for each).
DEFAULT_MAX_REQUEST_BYTES = HttpLimits.max_request_bytes  # 4 MiB, REST body and gRPC message
DEFAULT_MAX_CONNECTIONS = HttpLimits.max_connections  # 512
DEFAULT_HEADER_TIMEOUT = HttpLimits.header_timeout  # 10 s
DEFAULT_READ_TIMEOUT = HttpLimits.read_timeout  # 30 s, TF Serving's --rest_api_timeout_in_ms
DEFAULT_DRAIN_TIMEOUT = 30.0


class DevServer:
    """REST + gRPC development server over an export base directory.

    Args:
      base_dir: the directory ``aiayn export`` writes (``<base>/<name>/<version>/``).
      model_names: names to serve; default: every model folder found.
      host: interface to bind; 127.0.0.1 unless told otherwise.
      rest_port: REST port (0 = any free port; None = no REST).
      grpc_port: gRPC port (0 = any free port; None = no gRPC).
      poll_seconds: how often to look for new versions (and a changed models.config).
      max_batch_size: batch limit; default: the export's ``max_batch_size``.
      batch_timeout_ms: how long a request waits for batch-mates.
      warmup: replay the warmup requests before serving a version.
      threads: worker threads per front end (REST handlers; gRPC handlers).
      max_request_bytes: the largest REST body and gRPC message accepted (413 /
        RESOURCE_EXHAUSTED beyond).
      max_connections: open REST connections (more are answered 503 and closed) and
        concurrent gRPC calls (more get RESOURCE_EXHAUSTED).
      header_timeout: seconds a REST client has to send its request line and headers (and that
        an idle kept-alive connection stays open).
      read_timeout: seconds a REST client has, after its headers, to send the whole body.
      drain_timeout: on stop (SIGTERM), how long requests in flight may take to finish; also
        how long a replaced version may finish its requests before it is closed.
      model_config_file: models.config (version policies and labels); default
        ``<base_dir>/models.config`` when present.
      load_retry_seconds: first wait before retrying a version that failed to load (doubles,
        up to 60 s; a change in its directory retries at once).
    """

    def __init__(self, base_dir: str | Path, model_names: list[str] | None = None,
                 host: str = "127.0.0.1", rest_port: int | None = 8501,
                 grpc_port: int | None = 8500, poll_seconds: float = 2.0,
                 max_batch_size: int | None = None, batch_timeout_ms: float = 5.0,
                 warmup: bool = True, threads: int = 32, *,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 header_timeout: float = DEFAULT_HEADER_TIMEOUT,
                 read_timeout: float = DEFAULT_READ_TIMEOUT,
                 drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
                 model_config_file: str | Path | None = None,
                 load_retry_seconds: float = 5.0):
        self.limits = HttpLimits(workers=threads, max_connections=max_connections,
                                 max_request_bytes=max_request_bytes,
                                 header_timeout=header_timeout, read_timeout=read_timeout,
                                 write_timeout=max(read_timeout, 1.0))
        self.manager = ModelManager(base_dir, model_names, poll_seconds, max_batch_size,
                                    batch_timeout_ms, warmup, model_config_file=model_config_file,
                                    load_retry_seconds=load_retry_seconds,
                                    drain_timeout=drain_timeout)
        self.predictor = Predictor(self.manager)
        self.host = host
        self.rest_port = rest_port
        self.grpc_port = grpc_port
        self.threads = threads
        self.drain_timeout = drain_timeout
        self._http: PooledHTTPServer | None = None
        self._grpc = None
        self._stopped = False

    @property
    def rest(self) -> PooledHTTPServer | None:
        """The REST server (``.stats``: connections, requests, framing errors, timeouts, 5xx;
        ``.open_connections``), once started."""
        return self._http

    def start(self) -> DevServer:
        """Loads the models and binds the ports; returns at once (threads serve)."""
        self.manager.start()
        if self.rest_port is not None:
            self._http = make_rest_server(self.host, self.rest_port, self.predictor, self.limits)
            self.rest_port = self._http.server_address[1]
            self._http.start()
        if self.grpc_port is not None:
            from aiayn.export.grpc_api import make_grpc_server

            self._grpc = make_grpc_server(self.predictor, self.threads,
                                          self.limits.max_request_bytes,
                                          self.limits.max_connections)
            address = f"[{self.host}]" if ":" in self.host else self.host
            self.grpc_port = self._grpc.add_insecure_port(f"{address}:{self.grpc_port}")
            self._grpc.start()
        log.info("Serving %s: REST http://%s:%s, gRPC %s:%s (%d workers per API, %d connections, "
                 "requests up to %d bytes, header/body timeouts %g/%g s).",
                 self.manager.base_dir, self.host, self.rest_port, self.host, self.grpc_port,
                 self.threads, self.limits.max_connections, self.limits.max_request_bytes,
                 self.limits.header_timeout, self.limits.read_timeout)
        return self

    def stop(self, drain_timeout: float | None = None) -> None:
        """Stops accepting, lets requests in flight finish (`drain_timeout` s), closes.

        ``stop()`` drains for up to ``drain_timeout`` given to the constructor; ``stop(0)``
        stops at once.
        """
        if self._stopped:
            return
        self._stopped = True
        timeout = self.drain_timeout if drain_timeout is None else drain_timeout
        grpc_done = self._grpc.stop(grace=timeout) if self._grpc is not None else None
        if self._http is not None:
            self._http.close(drain_timeout=timeout)
        if grpc_done is not None:
            grpc_done.wait(timeout + 1.0)
        self.manager.stop()

    def serve_forever(self) -> None:
        """Starts and blocks until SIGTERM or Ctrl-C, then drains and returns.

        On SIGTERM (installed when called from the main thread) and on Ctrl-C the server stops
        accepting, answers the requests in flight (``drain_timeout`` at most) and returns, so a
        supervisor's stop is a clean exit (status 0). A second SIGTERM while draining kills.
        """
        stop = threading.Event()
        previous = None
        if threading.current_thread() is threading.main_thread():
            def on_term(signum, frame):  # noqa: ARG001
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one kills
                stop.set()

            previous = signal.signal(signal.SIGTERM, on_term)
        try:
            self.start()
            while not stop.wait(1.0):
                pass
            log.info("SIGTERM: draining (up to %.0f s) and stopping.", self.drain_timeout)
        except KeyboardInterrupt:
            log.info("Interrupted: draining (up to %.0f s) and stopping.", self.drain_timeout)
        finally:
            started = time.monotonic()
            self.stop()
            log.info("Stopped in %.1f s.", time.monotonic() - started)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
