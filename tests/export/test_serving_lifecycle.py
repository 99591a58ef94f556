"""Versions come and go while the development server serves, as TF Serving's do: a soak of 64
clients (good and bad requests) across a hot swap loses no good request and makes no 5xx; a
half-copied version is shown failed, retried, and picked up once complete; version policies
and labels from models.config are honoured on both APIs and re-read when the file changes;
SIGTERM drains the request in flight and exits 0."""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.export.serving_helpers import (
    PREDICT,
    SENTENCES,
    Grpc,
    ThreadSampler,
    copy_version,
    get,
    grpc_request,
    post,
    raw_http,
    rest_translate,
    rss_mb,
    wait_for,
)

if TYPE_CHECKING:
    from aiayn.export.server import DevServer

pytestmark = pytest.mark.slow


def _state(port: int) -> list[tuple[str, str]]:
    """REST model status as [(version, state)], newest first."""
    status, body = get(port, "/v1/models/translate")
    return [(s["version"], s["state"]) for s in body.get("model_version_status", [])] \
        if status == 200 else []


# -- soak --------------------------------------------------------------------------------------
CLIENTS = 64
# 512 requests: each kind of request, good and bad, on both versions; bench/serving.py soaks
# longer.
PER_CLIENT = 8


def _bad_rest(port: int, k: int) -> int:
    k //= 4  # k % 4 picked the kind of request; the rest picks the kind of fault
    if k % 4 == 0:
        return raw_http(port, b"POST " + PREDICT.encode() + b" HTTP/1.1\r\n"
                              b"Content-Length: abc\r\n\r\n")[0]
    if k % 4 == 1:
        return post(port, PREDICT, b"[" * 5000 + b"]" * 5000)[0]
    if k % 4 == 2:
        return post(port, PREDICT, b'{"instances": [' + b"9" * 5000 + b"]}")[0]
    return post(port, "/v1/models/nope:predict", {"instances": ["x"]})[0]


def _bad_grpc(client: Grpc, k: int) -> str:
    request = grpc_request(["x"])
    if (k // 4) % 2 == 0:  # declares 50 million strings, carries one
        request.inputs["text"].tensor_shape.dim[0].size = 50_000_000
    else:
        request.model_spec.version_label = "nope"
    return client.predict(request)[0]


def _grpc_translate(port: int) -> tuple[list[str], int]:
    """SENTENCES over a connection of its own: (translations, the version that answered)."""
    client = Grpc(port)
    try:
        return client.translate(SENTENCES)
    finally:
        client.close()


class _Soak:
    """CLIENTS threads x PER_CLIENT requests of kind k % 4 (good REST, good gRPC, bad REST, bad
    gRPC), while a publisher copies version 2 in after 1/8 of them. Failures are collected, not
    raised, so that the test asserts them once the server has stopped."""

    def __init__(self, server: DevServer, version_dir: Path, base: Path):
        self.server, self.version_dir, self.base = server, version_dir, base
        self.total = CLIENTS * PER_CLIENT
        self.reference: list[str] = []
        self.warm_v2, self.swap_now = threading.Event(), threading.Event()
        self.at_swap: dict[str, int] = {}
        self.lock = threading.Lock()
        self.done = 0
        self.failures: list[str] = []
        self.codes: collections.Counter = collections.Counter()
        self.versions: collections.Counter = collections.Counter()  # gRPC answers by version
        self.threads_before = self.threads_max = 0
        self.seconds = 0.0

    def hold_the_swap(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Version 2, once warm, lets the clients' second halves go, then holds its swap until
        the soak's middle and until version 1 holds a request: the swap happens mid-traffic on
        any machine. `at_swap["inflight"]` is version 1's load at that moment."""
        from aiayn.export import servables

        real_warmup = servables.Servable.warmup

        def held_warmup(servable):
            count = real_warmup(servable)
            if servable.version == 2:
                self.warm_v2.set()
                self.swap_now.wait(120)
                v1 = self.server.manager.get("translate", 1)
                wait_for(lambda: v1.inflight > 0, 10, 0.001, "a request in flight on version 1")
                self.at_swap["inflight"] = v1.inflight
            return count

        monkeypatch.setattr(servables.Servable, "warmup", held_warmup)

    def run(self, reference: list[str]) -> None:
        """Publisher and clients to the last answer; the time taken and the most threads seen."""
        self.reference = reference
        publisher = threading.Thread(target=self._publish)
        publisher.start()
        self.threads_before = threading.active_count()
        started = time.monotonic()
        with ThreadSampler() as sampler:
            clients = [threading.Thread(target=self._client, args=(i,)) for i in range(CLIENTS)]
            for thread in clients:
                thread.start()
            for thread in clients:
                thread.join()
        self.seconds = time.monotonic() - started
        self.threads_max = sampler.max
        publisher.join()

    def _publish(self) -> None:
        wait_for(lambda: self.done >= self.total // 8, 120, 0.01, "the soak")
        copy_version(self.version_dir, self.base, 2)  # renamed into place, as `aiayn export`
        wait_for(lambda: self.done >= self.total * 5 // 8, 300, 0.005, "the soak's middle")
        self.swap_now.set()

    def _client(self, i: int) -> None:
        grpc_client = Grpc(self.server.grpc_port)
        try:
            for j in range(PER_CLIENT):
                if j == PER_CLIENT // 2:  # the second half starts once v2 is warm
                    self.warm_v2.wait(120)
                outcome = self._request(grpc_client, i + j)
                with self.lock:
                    self.done += 1
                    self.codes[outcome] += 1
        finally:
            grpc_client.close()

    def _request(self, grpc_client: Grpc, k: int) -> str | None:
        """Request k, for a suffix of SENTENCES: its outcome ("rest 200", "grpc OK", ...), or
        None when it raised."""
        texts = SENTENCES[k % len(SENTENCES):] or SENTENCES
        want = self.reference[len(SENTENCES) - len(texts):]
        kind = k % 4
        try:
            if kind == 0:
                return self._good_rest(texts, want)
            if kind == 1:
                return self._good_grpc(grpc_client, texts, want)
            if kind == 2:
                return f"rest {_bad_rest(self.server.rest_port, k)}"
            return f"grpc {_bad_grpc(grpc_client, k)}"
        except Exception as err:  # noqa: BLE001 - a failure to count, not to raise
            self.failures.append(f"{kind}: {type(err).__name__}: {err}")
            return None

    def _good_rest(self, texts: list[str], want: list[str]) -> str:
        status, body = post(self.server.rest_port, PREDICT, {"instances": texts})
        got = [p["translation"] for p in body.get("predictions", [])]
        if status != 200 or got != want:
            self.failures.append(f"REST {status} {body}")
        return f"rest {status}"

    def _good_grpc(self, grpc_client: Grpc, texts: list[str], want: list[str]) -> str:
        code, response = grpc_client.predict(grpc_request(texts))
        if code != "OK":
            self.failures.append(f"gRPC {code} {response}")
            return f"grpc {code}"
        import tensorflow as tf

        got = [v.decode() for v in tf.make_ndarray(response.outputs["translation"]).tolist()]
        with self.lock:
            self.versions[response.model_spec.version.value] += 1
        if got != want:
            self.failures.append(f"gRPC wrong answer {got} != {want}")
        return f"grpc {code}"

    def report(self, rss_growth: float) -> None:
        """The soak's numbers, in the log and on stdout (bench/serving.py soaks longer)."""
        logging.getLogger("aiayn.export.server").info(
            "soak: %.1f s, versions answering gRPC %s, codes %s, RSS +%.0f MB, threads %d -> %d",
            self.seconds, dict(self.versions), dict(self.codes), rss_growth,
            self.threads_before, self.threads_max)
        print(f"soak: {self.seconds:.1f} s, gRPC answers by version {dict(self.versions)}, "
              f"{self.at_swap['inflight']} in flight on v1 at the swap, "
              f"RSS +{rss_growth:.0f} MB, threads {self.threads_before} -> max {self.threads_max}")


@contextlib.contextmanager
def _server(base: Path, **options) -> Iterator[DevServer]:
    """A started DevServer on free ports, stopped on the way out."""
    from aiayn.export.server import DevServer

    server = DevServer(base, rest_port=0, grpc_port=0, **options).start()
    try:
        yield server
    finally:
        server.stop(0)


@contextlib.contextmanager
def _serving(base: Path, **options) -> Iterator[tuple[DevServer, Grpc]]:
    """`_server` with a gRPC client, closed before the server stops."""
    with _server(base, **options) as server:
        client = Grpc(server.grpc_port)
        try:
            yield server, client
        finally:
            client.close()


def test_soak_with_a_version_published_mid_run(exported, tmp_path, caplog, monkeypatch):
    """64 clients x 8 requests, half good (REST and gRPC) and half bad; version 2 is published
    after 1/8 of them. Version 2 loads and warms up meanwhile, and takes over while version 1
    has requests in flight (a hook holds the swap until the middle of the soak and until
    version 1 holds a request, so the swap happens mid-traffic on any machine)."""
    caplog.set_level(logging.INFO, logger="aiayn.export.server")
    _, version_dir = exported
    copy_version(version_dir, tmp_path, 1)
    with _server(tmp_path, poll_seconds=0.3, batch_timeout_ms=20, warmup=True) as server:
        soak = _Soak(server, version_dir, tmp_path)
        soak.hold_the_swap(monkeypatch)
        reference = rest_translate(server.rest_port, SENTENCES)
        assert _grpc_translate(server.grpc_port) == (reference, 1)
        rss_before = rss_mb()
        soak.run(reference)
        # Version 2 takes over (after its warmup); version 1 finishes and is unloaded.
        wait_for(lambda: _state(server.rest_port) == [("2", "AVAILABLE")], 90, 0.2,
                 "version 2 alone")
        rss_growth = rss_mb() - rss_before
        assert _grpc_translate(server.grpc_port) == (reference, 2)
    total, codes, versions = soak.total, soak.codes, soak.versions
    assert soak.failures == [], soak.failures[:5]
    assert soak.done == total
    assert not [c for c in codes if c.startswith("rest 5") or c.split()[-1] in (
        "INTERNAL", "UNKNOWN", "UNAVAILABLE", "DEADLINE_EXCEEDED")], codes
    assert server.rest.stats["5xx"] == 0
    good = sum(n for c, n in codes.items() if c in ("rest 200", "grpc OK"))
    assert good == total // 2, codes
    assert sum(n for c, n in codes.items() if c.startswith("rest 4")) == total // 4
    assert codes["grpc INVALID_ARGUMENT"] == total // 4
    assert soak.at_swap["inflight"] > 0 and versions[1] > 0 and versions[2] > 0, (
        soak.at_swap, versions)
    assert rss_growth < 300, rss_growth
    # The clients' own threads, plus at most the gRPC pool's growth: no thread per connection.
    assert soak.threads_max - soak.threads_before <= CLIENTS + 32 + 8, (
        soak.threads_before, soak.threads_max)
    assert any("Loaded translate version 2" in r.getMessage() and "11 warmup requests" in
               r.getMessage() for r in caplog.records)
    soak.report(rss_growth)


# -- a half-copied version ---------------------------------------------------------------------
def _copy_interrupted(version_dir: Path, target: Path) -> None:
    """Copies a version the way `cp -r` does, interrupted: saved_model.pb and the variables'
    index, not the variables' data."""
    (target / "variables").mkdir(parents=True)
    shutil.copy2(version_dir / "saved_model.pb", target)
    shutil.copy2(version_dir / "variables" / "variables.index", target / "variables")


def _complete_copy(version_dir: Path, target: Path) -> None:
    """Finishes `_copy_interrupted`'s copy, leaving the files already there alone."""
    for item in version_dir.iterdir():
        copied = target / item.name
        if item.is_dir():
            shutil.copytree(item, copied, dirs_exist_ok=True)
        elif not copied.exists():
            shutil.copy2(item, copied)


def _failed_twice(server: DevServer, version: int) -> bool:
    """Whether `version` is END (failed to load) after at least two attempts."""
    states = {s.version: s for s in server.manager.version_states("translate")}
    return version in states and states[version].state == "END" and \
        states[version].attempts >= 2


def test_half_copied_version_is_retried_and_picked_up(exported, tmp_path):
    _, version_dir = exported
    copy_version(version_dir, tmp_path, 1)
    half = tmp_path / "translate" / "2"
    with _serving(tmp_path, poll_seconds=0.2, warmup=False,
                  load_retry_seconds=0.3) as (server, client):
        reference, version = client.translate(SENTENCES)
        assert version == 1
        _copy_interrupted(version_dir, half)
        wait_for(lambda: _failed_twice(server, 2), 30, 0.1, "version 2 to fail twice")
        # Both status APIs show it, with its error; version 1 still serves.
        status, body = get(server.rest_port, "/v1/models/translate")
        assert status == 200
        (v2, v1) = body["model_version_status"]
        assert (v2["version"], v2["state"], v1["version"], v1["state"]) == (
            "2", "END", "1", "AVAILABLE")
        assert v2["status"]["error_code"] != "OK" and v2["status"]["error_message"]
        code, response = client.status()
        assert code == "OK"
        assert [(s.version, s.state) for s in response.model_version_status] == [(2, 50),
                                                                                  (1, 30)]
        assert response.model_version_status[0].status.error_message == \
            v2["status"]["error_message"]
        assert client.translate(SENTENCES) == (reference, 1)
        assert rest_translate(server.rest_port, SENTENCES) == reference
        # The copy completes: picked up without a restart; version 1 is retired.
        _complete_copy(version_dir, half)
        wait_for(lambda: _state(server.rest_port) == [("2", "AVAILABLE")], 60, 0.2,
                 "version 2 to take over")
        assert client.translate(SENTENCES) == (reference, 2)
        assert rest_translate(server.rest_port, SENTENCES) == reference
    # A server that starts while the newest version is half-copied serves the one before it.
    shutil.copytree(version_dir / "variables", tmp_path / "translate" / "3" / "variables")
    with _serving(tmp_path, poll_seconds=0.2, warmup=False,
                  load_retry_seconds=60) as (server, client):
        assert client.translate(SENTENCES) == (reference, 2)
        (v3, v2) = get(server.rest_port, "/v1/models/translate")[1]["model_version_status"]
        assert (v3["state"], v2["state"]) == ("END", "AVAILABLE") and "saved_model" in \
            v3["status"]["error_message"].lower().replace(" ", "_")


# -- version policies and labels ---------------------------------------------------------------
def _models_config(base, policy: str, labels: dict[str, int]) -> None:
    entries = "".join(f'    version_labels {{ key: "{k}" value: {v} }}\n'
                      for k, v in labels.items())
    text = ("model_config_list {\n  config {\n    name: \"translate\"\n"
            f"    base_path: \"{base / 'translate'}\"\n    model_platform: \"tensorflow\"\n"
            f"    model_version_policy {{ {policy} }}\n{entries}  }}\n}}\n")
    tmp = base / "models.config.tmp"
    tmp.write_text(text)
    tmp.replace(base / "models.config")


def _predict_x(port: int, path: str) -> tuple[int, dict]:
    """A one-word REST predict on `path`: (status, body)."""
    return post(port, path, {"instances": ["x"]})


def test_version_policy_and_labels_from_models_config(exported, tmp_path):
    _, version_dir = exported
    copy_version(version_dir, tmp_path, 1)
    copy_version(version_dir, tmp_path, 2)
    _models_config(tmp_path, "all {}", {"stable": 1, "canary": 2})
    with _serving(tmp_path, poll_seconds=0.2, warmup=False) as (server, client):
        port = server.rest_port
        assert _state(port) == [("2", "AVAILABLE"), ("1", "AVAILABLE")]  # all {}
        reference, version = client.translate(SENTENCES)
        assert version == 2  # no version named: the latest
        assert client.translate(SENTENCES, label="stable") == (reference, 1)
        assert client.translate(SENTENCES, label="canary") == (reference, 2)
        assert client.translate(SENTENCES, version=1) == (reference, 1)
        assert rest_translate(port, SENTENCES, "/v1/models/translate/labels/stable:predict") \
            == reference
        status, body = get(port, "/v1/models/translate/labels/canary")
        assert status == 200 and [s["version"] for s in body["model_version_status"]] == ["2"]
        status, body = get(port, "/v1/models/translate/labels/stable/metadata")
        assert status == 200 and body["model_spec"]["version"] == "1"
        code, response = client.status(label="stable")
        assert code == "OK" and [s.version for s in response.model_version_status] == [1]
        status, body = _predict_x(port, "/v1/models/translate/labels/beta:predict")
        assert status == 400 and "Unrecognized servable version label: beta" in body["error"]
        assert "canary" in body["error"] and "stable" in body["error"]
        assert client.predict(grpc_request(["x"], label="beta"))[0] == "INVALID_ARGUMENT"

        # The file changes: specific {1}; version 2 stops serving, canary is gone.
        _models_config(tmp_path, "specific { versions: 1 }", {"stable": 1})
        wait_for(lambda: _state(port) == [("1", "AVAILABLE")], 30, 0.1, "version 2 retired")
        assert client.translate(SENTENCES) == (reference, 1)
        status, body = _predict_x(port, "/v1/models/translate/versions/2:predict")
        assert status == 404 and "Available version(s): [1]" in body["error"]
        assert _predict_x(port, "/v1/models/translate/labels/canary:predict")[0] == 400
        assert rest_translate(port, SENTENCES, "/v1/models/translate/labels/stable:predict") \
            == reference

        # A broken file is ignored (logged); the last good policy stays.
        (tmp_path / "models.config").write_text("model_config_list { config { nonsense")
        time.sleep(0.5)
        assert server.manager.config_error
        assert _state(port) == [("1", "AVAILABLE")]
        assert client.translate(SENTENCES, label="stable") == (reference, 1)


def test_model_policy_picks_versions():
    from aiayn.export.model_config import ModelConfigError, parse_models_config

    policies = parse_models_config("""
        model_config_list {
          config { name: "a" base_path: "/x/a" model_platform: "tensorflow" }
          config { name: "b" model_version_policy { latest { num_versions: 2 } } }
          config { name: "c" model_version_policy { specific { versions: 3 versions: 1 } }
                   version_labels { key: "stable" value: 1 } }
          config { name: "d" model_version_policy { all {} } }
        }""")
    on_disk = [1, 2, 3, 4]
    assert policies["a"].aspired(on_disk) == [4] and policies["a"].base_path == "/x/a"
    assert policies["b"].aspired(on_disk) == [3, 4]
    assert policies["c"].aspired(on_disk) == [1, 3] and dict(policies["c"].labels) == {
        "stable": 1}
    assert policies["d"].aspired(on_disk) == on_disk
    assert policies["c"].aspired([2]) == []
    with pytest.raises(ModelConfigError, match="configured twice"):
        parse_models_config('model_config_list { config { name: "a" } config { name: "a" } }')
    with pytest.raises(ModelConfigError, match="names no version"):
        parse_models_config('model_config_list { config { name: "a" '
                            'model_version_policy { specific {} } } }')
    with pytest.raises(ModelConfigError):
        parse_models_config("model_config_list { config { nonsense")


# -- SIGTERM -----------------------------------------------------------------------------------
def test_sigterm_drains_the_request_in_flight_and_exits_0(exported, tmp_path):
    """`aiayn serve --backend dev` in a subprocess: a request waits 3 s in the batcher, SIGTERM
    arrives meanwhile; the request is answered, new connections are refused, exit status 0."""
    _, version_dir = exported
    copy_version(version_dir, tmp_path, 1)
    command = [sys.executable, "-m", "aiayn.pipeline.cli", "serve", "--backend", "dev",
               "--base-dir", str(tmp_path), "--rest-port", "0", "--grpc-port", "0",
               "--batch-timeout-ms", "3000", "--drain-timeout", "20"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    try:
        def ready():
            for line in list(lines):
                match = re.search(r"Serving .*REST http://127\.0\.0\.1:(\d+)", line)
                if match:
                    return int(match.group(1))
            assert process.poll() is None, "".join(lines)
            return None
        port = wait_for(ready, 120, 0.1, "the server to start")
        answer = {}

        def request():
            answer["reply"] = post(port, PREDICT, {"instances": SENTENCES}, timeout=30)
            answer["at"] = time.monotonic()

        in_flight = threading.Thread(target=request)
        in_flight.start()
        time.sleep(1.0)  # the request now waits in the batcher (3 s)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(OSError):  # no longer accepting
            post(port, PREDICT, {"instances": ["x"]}, timeout=5)
        in_flight.join(30)
        assert process.wait(60) == 0, "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    status, body = answer["reply"]
    assert status == 200 and len(body["predictions"]) == len(SENTENCES)
    assert answer["at"] - sent > 0.5  # it was answered after the signal, by the drain
    log = "".join(lines)
    assert "SIGTERM: draining" in log and "Stopped in" in log
    assert json.dumps(body)  # a complete JSON answer
