"""Serving benchmark: the `small` preset behind the development server, and in-process.

    python bench/serving.py [--requests 40] [--preset small] [--quick]

Measures, on whatever CPU/GPU this runs on:
  * latency p50/p99 of single-sentence REST requests (one at a time);
  * throughput (sentences/s) at concurrency 1, 8 and 32 (single-sentence REST requests; the
    server's batcher merges concurrent ones);
  * the SavedModel's own throughput in-process at batch 64, beam 4 and greedy;
  * a soak: 64 concurrent clients (REST and gRPC) send good requests mixed with bad ones
    (malformed Content-Length, 5000-deep JSON, a 5000-digit number, an unknown model, a gRPC
    tensor declaring 50 million strings, an unknown label) while 200 slow clients hold
    connections open (headers, no body) and a new version is published after a quarter of
    the requests (each client's second half waits until it is loaded, so both versions serve):
    ``soak_failed_good`` (good requests not answered with the right translation; must be 0),
    ``soak_5xx`` (REST 5xx and gRPC INTERNAL/UNKNOWN/UNAVAILABLE answers; must be 0),
    ``rss_growth_mb`` (this process's RSS after the soak, new version loaded, minus before) and
    ``max_threads`` (threading.active_count() sampled during the soak and the flood; it counts
    the 64 client threads of the benchmark itself).

``--quick`` (a few minutes on 2 CPU cores): fewer latency runs, ``decode.max_extra_length=10``
unless given, 64 clients x 2 requests in the soak.

Uses the trained `small` run (<run_dir>/final.weights.h5 and data/spm.model) when present;
otherwise random weights and a SentencePiece model trained on synthetic text (the report says
so: random weights rarely emit EOS, so every sentence decodes to the full input + max_extra_length
tokens, a pessimistic case). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import io
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WORDS = ("the light word god earth heaven day night water king son man woman house land "
         "people city river mountain bread peace love said came went saw made gave took").split()


def _sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18))).capitalize() + "."
            for _ in range(n)]


def _tokenizer(cfg):
    from aiayn.models.tokenizer import SubwordTokenizer
    from aiayn.pipeline.data.vocab import vocab_path

    path = vocab_path(cfg)
    if Path(path).exists():
        return SubwordTokenizer.from_file(path), f"trained vocabulary {path}"
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_sentences(3000, seed=1)), model_writer=buf,
        vocab_size=min(cfg.data.vocab_size, 400), hard_vocab_limit=False, pad_id=0, unk_id=1,
        bos_id=2, eos_id=3, minloglevel=2)
    return (SubwordTokenizer(buf.getvalue()),
            "synthetic SentencePiece vocabulary (no data/spm.model)")


def _percentile(values, q):
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(q / 100 * (len(values) - 1)))))
    return values[k]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _post(port: int, path: str, body: bytes, timeout: float = 600.0) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


_BAD_REST = [
    b"Content-Length: abc",  # sent raw
    b"[" * 5000 + b"]" * 5000,
    b'{"instances": [' + b"9" * 5000 + b"]}",
    b"unknown model",
]


def _bad_rest(port: int, k: int) -> int:
    kind = _BAD_REST[k % len(_BAD_REST)]
    if kind == b"Content-Length: abc":
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(b"POST /v1/models/translate:predict HTTP/1.1\r\n"
                         b"Content-Length: abc\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return int(data.split()[1])
    if kind == b"unknown model":
        return _post(port, "/v1/models/nope:predict", b'{"instances": ["x"]}')[0]
    return _post(port, "/v1/models/translate:predict", kind)[0]


class _Soak:
    """The soak's clients and what they counted (:func:`soak`)."""

    def __init__(self, server, expected: dict[str, str], clients: int, per_client: int,
                 exact: bool):
        self.server, self.expected, self.exact = server, expected, exact
        self.texts = sorted(expected)
        self.clients, self.per_client = clients, per_client
        self.total = clients * per_client
        self.lock = threading.Lock()
        self.done = 0
        self.codes: collections.Counter = collections.Counter()
        self.versions: collections.Counter = collections.Counter()
        self.failed_good: list[str] = []
        self.differing = 0
        self.max_threads = threading.active_count()
        self.stop_sampling = threading.Event()

    def sample_threads(self) -> None:
        while not self.stop_sampling.wait(0.05):
            self.max_threads = max(self.max_threads, threading.active_count())

    def publish(self, base: Path, version_dir: Path) -> None:
        """Version 2 appears (copied, then renamed) after a quarter of the requests."""
        while self.done < self.total // 4:
            time.sleep(0.01)
        tmp = base / "translate" / ".tmp-bench-2"
        shutil.copytree(version_dir, tmp)
        tmp.rename(base / "translate" / "2")

    def client(self, i: int) -> None:
        import grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        channel = grpc.insecure_channel(f"127.0.0.1:{self.server.grpc_port}")
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for j in range(self.per_client):
            if j == self.per_client // 2:  # the second half goes to the new version
                self._wait_for_version_2()
            k = i + j
            try:
                outcome = self._request(stub, k)
            except Exception as err:  # noqa: BLE001 - counted, the soak goes on
                outcome = f"error {type(err).__name__}"
                if k % 4 < 2:
                    self.failed_good.append(f"{type(err).__name__}: {err}")
            with self.lock:
                self.done += 1
                self.codes[outcome] += 1
        channel.close()

    def _wait_for_version_2(self) -> None:
        deadline = time.monotonic() + 600
        while 2 not in self.server.manager.versions("translate") and \
                time.monotonic() < deadline:
            time.sleep(0.05)

    def _request(self, stub, k: int) -> str:
        """Request `k`: good REST, good gRPC, bad REST, bad gRPC in turn; its outcome."""
        text = self.texts[k % len(self.texts)]
        if k % 4 == 0:
            return self._good_rest(text)
        if k % 4 == 1:
            return self._good_grpc(stub, text)
        if k % 4 == 2:
            return f"rest {_bad_rest(self.server.rest_port, k // 4)}"
        return _bad_grpc(stub, k // 4)

    def _good_rest(self, text: str) -> str:
        status, body = _post(self.server.rest_port, "/v1/models/translate:predict",
                             json.dumps({"instances": [text]}).encode())
        if status != 200:
            self.failed_good.append(f"REST {status} {body}")
        else:
            self._check([p.get("translation") for p in body["predictions"]], text, "REST")
        return f"rest {status}"

    def _good_grpc(self, stub, text: str) -> str:
        import grpc
        import tensorflow as tf

        try:
            response = stub.Predict(_predict_request([text]), timeout=600)
        except grpc.RpcError as err:
            self.failed_good.append(f"gRPC {err.code().name} {err.details()}")
            return f"grpc {err.code().name}"
        got = [v.decode() for v in tf.make_ndarray(response.outputs["translation"]).tolist()]
        with self.lock:
            self.versions[response.model_spec.version.value] += 1
        self._check(got, text, "gRPC")
        return "grpc OK"

    def _check(self, got: list, text: str, api: str) -> None:
        if len(got) != 1 or not isinstance(got[0], str):
            self.failed_good.append(f"{api}: malformed answer {got}")
        elif got[0] != self.expected[text]:
            if self.exact:
                self.failed_good.append(f"{api}: wrong answer {got}")
            else:
                with self.lock:
                    self.differing += 1

    def result(self, seconds: float, rss_before: float) -> dict:
        bad_5xx = sum(n for c, n in self.codes.items()
                      if c.startswith("rest 5") or c.split()[-1] in ("INTERNAL", "UNKNOWN",
                                                                     "UNAVAILABLE"))
        return {"soak_failed_good": len(self.failed_good), "soak_5xx": bad_5xx,
                "soak_answers_differing": self.differing,
                "rss_growth_mb": round(_rss_mb() - rss_before, 1),
                "max_threads": self.max_threads,
                "soak_requests": self.total, "soak_seconds": round(seconds, 1),
                "soak_grpc_answers_by_version": {str(k): v
                                                 for k, v in sorted(self.versions.items())},
                "soak_codes": dict(sorted(self.codes.items())),
                "soak_failures_sample": self.failed_good[:3]}


def _predict_request(texts: list[str]):
    from tensorflow_serving.apis import predict_pb2

    from aiayn.export.codec import texts_proto

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "translate"
    request.inputs["text"].CopyFrom(texts_proto(texts))
    return request


def _bad_grpc(stub, k: int) -> str:
    """An unknown version label, or a tensor declaring 50 million strings: its gRPC code."""
    import grpc

    request = _predict_request(["x"])
    if k % 2:
        request.model_spec.version_label = "nope"
    else:
        request.inputs["text"].tensor_shape.dim[0].size = 50_000_000
    try:
        stub.Predict(request, timeout=60)
    except grpc.RpcError as err:
        return f"grpc {err.code().name}"
    return "grpc OK (a bad request accepted!)"


def _slow_clients(port: int, n: int) -> list[socket.socket]:
    """`n` connections that send a request's headers and never its body."""
    slow = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.sendall(b"POST /v1/models/translate:predict HTTP/1.1\r\nContent-Length: 100\r\n"
                     b"\r\n")
        slow.append(sock)
    return slow


def soak(server, base: Path, version_dir: Path, expected: dict[str, str],
         clients: int = 64, per_client: int = 4, exact: bool = True) -> dict:
    """64 clients, half good / half bad requests, a flood of 200 slow clients, and a new
    version published after a quarter of the requests (see the module docstring).

    A good request fails when it gets no 200 / OK, or (`exact`) not the expected translation.
    With random weights the search fills its whole length budget, which depends on the padded
    width of the merged batch (docs/ARCHITECTURE.md), so answers may legitimately differ from
    a lone request's: they are counted apart (``soak_answers_differing``) when not `exact`.
    """
    state = _Soak(server, expected, clients, per_client, exact)
    rss_before = _rss_mb()
    sampler = threading.Thread(target=state.sample_threads, daemon=True)
    sampler.start()
    slow = _slow_clients(server.rest_port, 200)
    publisher = threading.Thread(target=state.publish, args=(base, version_dir), daemon=True)
    publisher.start()
    started = time.perf_counter()
    threads = [threading.Thread(target=state.client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    publisher.join()
    for sock in slow:
        sock.close()
    # The new version takes over (if it has not yet): wait for it, then measure memory.
    deadline = time.monotonic() + 600
    while server.manager.versions("translate") != [2] and time.monotonic() < deadline:
        time.sleep(0.2)
    state.stop_sampling.set()
    sampler.join()
    return state.result(seconds, rss_before)


def _parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--requests", type=int, default=20, help="single-sentence latency runs")
    parser.add_argument("--max-extra-length", type=int, default=None,
                        help="override decode.max_extra_length (default: the preset's)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer runs, max_extra_length 10 unless given, a shorter soak")
    parser.add_argument("--soak-per-client", type=int, default=None,
                        help="requests per soak client (64 clients; default 4, --quick 2)")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests = min(args.requests, 8)
        if args.max_extra_length is None:
            args.max_extra_length = 10
    args.soak_per_client = args.soak_per_client or (2 if args.quick else 4)
    return args


def _model(cfg):
    """The preset's model with the trained weights when there are any: (model, tokenizer,
    weights note, vocabulary note)."""
    from aiayn.pipeline.training.artifacts import RunFiles, build_model

    tokenizer, vocab_note = _tokenizer(cfg)
    synthetic = "synthetic" in vocab_note
    if synthetic:  # nor the output vocabulary `aiayn vocab` writes: the decoder produces all
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data,
                                                                output_vocabulary="joint"))
    model = build_model(cfg, tokenizer)
    weights = RunFiles.of(cfg).final
    if weights.exists() and not synthetic:
        model.load_weights(str(weights))
        return model, tokenizer, f"trained weights {weights}", vocab_note
    return model, tokenizer, "RANDOM weights (no trained small run found)", vocab_note


def _export_beam_and_greedy(cfg, model, tokenizer, base: str) -> dict[str, Path]:
    """Two exports of the same weights under `base`: the preset's beam search and greedy."""
    from aiayn.export import saved_model as sm

    t0 = time.perf_counter()
    beam_opts = sm.ServingOptions.from_configs(cfg.decode, cfg.export)
    sm.export_saved_model(model, tokenizer, base, "translate", options=beam_opts,
                          sample_texts=["Hello."])
    greedy_opts = dataclasses.replace(beam_opts, beam_size=1, n_best=1)
    greedy_dir = sm.export_saved_model(model, tokenizer, base, "greedy",
                                       options=greedy_opts, sample_texts=["Hello."])
    print(f"# two exports written in {time.perf_counter() - t0:.1f}s")
    return {"beam4": Path(base) / "translate" / "1", "greedy": Path(greedy_dir)}


def _inprocess_rates(exports: dict[str, Path]) -> dict:
    """Each SavedModel's sentences per second, in this process, at batch 64."""
    import tensorflow as tf

    batch = _sentences(64, seed=2)
    results = {}
    for label, path in exports.items():
        fn = tf.saved_model.load(str(path)).signatures["serving_default"]
        fn(text=tf.constant(batch[:2]))  # warm
        runs, start = 0, time.perf_counter()
        while runs < 2 or (runs < 5 and time.perf_counter() - start < 20):
            fn(text=tf.constant(batch))
            runs += 1
        results[f"inprocess_{label}_sent_per_s"] = round(64 * runs / (time.perf_counter() - start),
                                                         2)
    return results


def _rest_rates(client, sentences: list[str], requests: int) -> dict:
    """Latency of single-sentence requests one at a time, then throughput at concurrency
    1, 8 and 32."""
    client.translate(sentences[:1])
    latencies = []
    for text in sentences[:requests]:
        start = time.perf_counter()
        client.translate([text])
        latencies.append((time.perf_counter() - start) * 1000)
    results = {"p50_ms": round(_percentile(latencies, 50), 1),
               "p99_ms": round(_percentile(latencies, 99), 1)}
    for conc in (1, 8, 32):
        n = max(16, 2 * conc)
        with concurrent.futures.ThreadPoolExecutor(conc) as pool:
            start = time.perf_counter()
            list(pool.map(lambda t: client.translate([t]), sentences[:n]))
            elapsed = time.perf_counter() - start
        results[f"throughput_c{conc}"] = round(n / elapsed, 2)
    return results


def _serve_and_soak(base: str, args, exact: bool) -> dict:
    """The development server over `base`: the REST figures, then the soak."""
    from aiayn.export.client import RestClient
    from aiayn.export.server import DevServer

    server = DevServer(base, model_names=["translate"], rest_port=0, grpc_port=0,
                       batch_timeout_ms=5, warmup=False, poll_seconds=0.5).start()
    client = RestClient(f"http://127.0.0.1:{server.rest_port}")
    try:
        sentences = _sentences(max(args.requests, 64), seed=3)
        results = _rest_rates(client, sentences, args.requests)
        batcher = server.manager.get("translate").batchers["serving_default"]
        results["largest_server_batch"] = batcher.largest_batch
        expected = {t: client.translate([t])[0].text for t in sentences[:8]}  # alone
        t0 = time.perf_counter()
        results.update(soak(server, Path(base), Path(base) / "translate" / "1", expected,
                            per_client=args.soak_per_client, exact=exact))
        settle = max(0.0, time.perf_counter() - t0 - results["soak_seconds"])
        print(f"# soak: {results['soak_requests']} requests by 64 clients in "
              f"{results['soak_seconds']} s (+ {settle:.1f} s for the new version to take "
              f"over); gRPC answers by version "
              f"{results['soak_grpc_answers_by_version']}; codes {results['soak_codes']}")
    finally:
        server.stop(0)
    return results


_TABLE = [("latency p50, 1 sentence (ms)", "p50_ms"), ("latency p99, 1 sentence (ms)", "p99_ms"),
          ("throughput, concurrency 1 (sent/s)", "throughput_c1"),
          ("throughput, concurrency 8 (sent/s)", "throughput_c8"),
          ("throughput, concurrency 32 (sent/s)", "throughput_c32"),
          ("in-process beam 4, batch 64 (sent/s)", "inprocess_beam4_sent_per_s"),
          ("in-process greedy, batch 64 (sent/s)", "inprocess_greedy_sent_per_s"),
          ("largest merged server batch", "largest_server_batch"),
          ("soak: failed good requests (must be 0)", "soak_failed_good"),
          ("soak: 5xx answers (must be 0)", "soak_5xx"),
          ("soak: RSS growth (MB)", "rss_growth_mb"),
          ("soak: max threads (incl. 64 clients)", "max_threads")]


def main(argv=None) -> int:
    args = _parse_args(argv)

    import tensorflow as tf

    from aiayn.pipeline.config import load_config

    overrides = []
    if args.max_extra_length is not None:
        overrides.append(f"decode.max_extra_length={args.max_extra_length}")
    cfg = load_config([args.preset], overrides)
    model, tokenizer, weights_note, vocab_note = _model(cfg)
    print(f"# preset={args.preset}  {weights_note}; {vocab_note}")
    print(f"# model: {cfg.model.num_layers} layers, hidden {cfg.model.hidden_dim}; beam "
          f"{cfg.decode.beam_size}, max_extra_length {cfg.decode.max_extra_length}; "
          f"{os.cpu_count()} CPUs; GPUs: {len(tf.config.list_physical_devices('GPU'))}")

    with tempfile.TemporaryDirectory(prefix="aiayn-bench-") as tmp:
        results = _inprocess_rates(_export_beam_and_greedy(cfg, model, tokenizer, tmp))
        results.update(_serve_and_soak(tmp, args, exact="RANDOM" not in weights_note))

    print()
    print(f"{'measure':<38}{'value':>12}")
    print("-" * 50)
    for label, key in _TABLE:
        print(f"{label:<38}{results[key]:>12}")
    results.update(preset=args.preset, random_weights="RANDOM" in weights_note,
                   weights=weights_note, quick=args.quick,
                   beam_size=cfg.decode.beam_size,
                   max_extra_length=cfg.decode.max_extra_length)
    print(json.dumps(results))
    return 0 if results["soak_failed_good"] == 0 and results["soak_5xx"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
