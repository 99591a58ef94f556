"""Versions come and go while the development server serves, as TF Serving's do: a soak of 64
clients (good and bad requests) across a hot swap loses no good request and makes no 5xx; a
half-copied version is shown failed, retried, and picked up once complete; version policies
and labels from models.config are honoured on both APIs and re-read when the file changes;
SIGTERM drains the request in flight and exits 0."""

from __future__ import annotations

import collections
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


def test_soak_with_a_version_published_mid_run(exported, tmp_path, caplog, monkeypatch):
    """64 clients x 8 requests, half good (REST and gRPC) and half bad; version 2 is published
    after 1/8 of them. Version 2 loads and warms up meanwhile, and takes over while version 1
    has requests in flight (a hook holds the swap until the middle of the soak and until
    version 1 holds a request, so the swap happens mid-traffic on any machine)."""
    from aiayn.export import servables
    from aiayn.export.server import DevServer

    caplog.set_level(logging.INFO, logger="aiayn.export.server")
    _, version_dir = exported
    copy_version(version_dir, tmp_path, 1)
    server = DevServer(tmp_path, rest_port=0, grpc_port=0, poll_seconds=0.3,
                       batch_timeout_ms=20, warmup=True).start()
    total = CLIENTS * PER_CLIENT
    warm_v2, swap_now = threading.Event(), threading.Event()
    at_swap = {}
    real_warmup = servables.Servable.warmup

    def held_warmup(servable):
        count = real_warmup(servable)
        if servable.version == 2:
            warm_v2.set()
            swap_now.wait(120)
            v1 = server.manager.get("translate", 1)
            wait_for(lambda: v1.inflight > 0, 10, 0.001, "a request in flight on version 1")
            at_swap["inflight"] = v1.inflight
        return count

    monkeypatch.setattr(servables.Servable, "warmup", held_warmup)
    try:
        reference = rest_translate(server.rest_port, SENTENCES)
        warm = Grpc(server.grpc_port)
        assert warm.translate(SENTENCES) == (reference, 1)
        warm.close()
        rss_before = rss_mb()
        lock = threading.Lock()
        done = [0]
        failures: list[str] = []
        codes: collections.Counter = collections.Counter()
        versions: collections.Counter = collections.Counter()

        def publish():
            wait_for(lambda: done[0] >= total // 8, 120, 0.01, "the soak")
            copy_version(version_dir, tmp_path, 2)  # renamed into place, as `aiayn export`
            wait_for(lambda: done[0] >= total * 5 // 8, 300, 0.005, "the soak's middle")
            swap_now.set()

        def client(i: int):
            grpc_client = Grpc(server.grpc_port)
            try:
                for j in range(PER_CLIENT):
                    if j == PER_CLIENT // 2:  # the second half starts once v2 is warm
                        warm_v2.wait(120)
                    k = i + j
                    texts = SENTENCES[k % len(SENTENCES):] or SENTENCES
                    want = reference[len(SENTENCES) - len(texts):]
                    kind = k % 4
                    outcome = None
                    try:
                        if kind == 0:
                            status, body = post(server.rest_port, PREDICT, {"instances": texts})
                            got = [p["translation"] for p in body.get("predictions", [])]
                            outcome = f"rest {status}"
                            if status != 200 or got != want:
                                failures.append(f"REST {status} {body}")
                        elif kind == 1:
                            code, response = grpc_client.predict(grpc_request(texts))
                            outcome = f"grpc {code}"
                            if code != "OK":
                                failures.append(f"gRPC {code} {response}")
                            else:
                                import tensorflow as tf

                                got = [v.decode() for v in tf.make_ndarray(
                                    response.outputs["translation"]).tolist()]
                                with lock:
                                    versions[response.model_spec.version.value] += 1
                                if got != want:
                                    failures.append(f"gRPC wrong answer {got} != {want}")
                        elif kind == 2:
                            outcome = f"rest {_bad_rest(server.rest_port, k)}"
                        else:
                            outcome = f"grpc {_bad_grpc(grpc_client, k)}"
                    except Exception as err:  # noqa: BLE001 - a failure to count, not to raise
                        failures.append(f"{kind}: {type(err).__name__}: {err}")
                    with lock:
                        done[0] += 1
                        codes[outcome] += 1
            finally:
                grpc_client.close()

        publisher = threading.Thread(target=publish)
        publisher.start()
        threads_before = threading.active_count()
        started = time.monotonic()
        with ThreadSampler() as sampler:
            threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        soak_seconds = time.monotonic() - started
        publisher.join()
        # Version 2 takes over (after its warmup); version 1 finishes and is unloaded.
        wait_for(lambda: _state(server.rest_port) == [("2", "AVAILABLE")], 90, 0.2,
                 "version 2 alone")
        rss_growth = rss_mb() - rss_before
        final = Grpc(server.grpc_port)
        assert final.translate(SENTENCES) == (reference, 2)
        final.close()
    finally:
        server.stop(0)
    assert failures == [], failures[:5]
    assert done[0] == total
    assert not [c for c in codes if c.startswith("rest 5") or c.split()[-1] in (
        "INTERNAL", "UNKNOWN", "UNAVAILABLE", "DEADLINE_EXCEEDED")], codes
    assert server.rest.stats["5xx"] == 0
    good = sum(n for c, n in codes.items() if c in ("rest 200", "grpc OK"))
    assert good == total // 2, codes
    assert sum(n for c, n in codes.items() if c.startswith("rest 4")) == total // 4
    assert codes["grpc INVALID_ARGUMENT"] == total // 4
    assert at_swap["inflight"] > 0 and versions[1] > 0 and versions[2] > 0, (at_swap, versions)
    assert rss_growth < 300, rss_growth
    # The clients' own threads, plus at most the gRPC pool's growth: no thread per connection.
    assert sampler.max - threads_before <= CLIENTS + 32 + 8, (threads_before, sampler.max)
    assert any("Loaded translate version 2" in r.getMessage() and "11 warmup requests" in
               r.getMessage() for r in caplog.records)
    logging.getLogger("aiayn.export.server").info(
        "soak: %.1f s, versions answering gRPC %s, codes %s, RSS +%.0f MB, threads %d -> %d",
        soak_seconds, dict(versions), dict(codes), rss_growth, threads_before, sampler.max)
    print(f"soak: {soak_seconds:.1f} s, gRPC answers by version {dict(versions)}, "
          f"{at_swap['inflight']} in flight on v1 at the swap, RSS +{rss_growth:.0f} MB, "
          f"threads {threads_before} -> max {sampler.max}")


# -- a half-copied version ---------------------------------------------------------------------
def test_half_copied_version_is_retried_and_picked_up(exported, tmp_path):
    from aiayn.export.server import DevServer

    _, version_dir = exported
    copy_version(version_dir, tmp_path, 1)
    server = DevServer(tmp_path, rest_port=0, grpc_port=0, poll_seconds=0.2, warmup=False,
                       load_retry_seconds=0.3).start()
    client = Grpc(server.grpc_port)
    try:
        reference, version = client.translate(SENTENCES)
        assert version == 1
        # Copy version 2 the way `cp -r` does, interrupted: saved_model.pb and the variables
        # index, not the variables' data.
        half = tmp_path / "translate" / "2"
        (half / "variables").mkdir(parents=True)
        shutil.copy2(version_dir / "saved_model.pb", half)
        shutil.copy2(version_dir / "variables" / "variables.index", half / "variables")

        def failed():
            states = {s.version: s for s in server.manager.version_states("translate")}
            return 2 in states and states[2].state == "END" and states[2].attempts >= 2
        wait_for(failed, 30, 0.1, "version 2 to fail twice")
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
        for item in version_dir.iterdir():
            target = half / item.name
            if item.is_dir():
                shutil.copytree(item, target, dirs_exist_ok=True)
            elif not target.exists():
                shutil.copy2(item, target)
        wait_for(lambda: _state(server.rest_port) == [("2", "AVAILABLE")], 60, 0.2,
                 "version 2 to take over")
        assert client.translate(SENTENCES) == (reference, 2)
        assert rest_translate(server.rest_port, SENTENCES) == reference
    finally:
        client.close()
        server.stop(0)
    # A server that starts while the newest version is half-copied serves the one before it.
    shutil.copytree(version_dir / "variables", tmp_path / "translate" / "3" / "variables")
    server = DevServer(tmp_path, rest_port=0, grpc_port=0, poll_seconds=0.2, warmup=False,
                       load_retry_seconds=60).start()
    client = Grpc(server.grpc_port)
    try:
        assert client.translate(SENTENCES) == (reference, 2)
        (v3, v2) = get(server.rest_port, "/v1/models/translate")[1]["model_version_status"]
        assert (v3["state"], v2["state"]) == ("END", "AVAILABLE") and "saved_model" in \
            v3["status"]["error_message"].lower().replace(" ", "_")
    finally:
        client.close()
        server.stop(0)


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


def test_version_policy_and_labels_from_models_config(exported, tmp_path):
    from aiayn.export.server import DevServer

    _, version_dir = exported
    copy_version(version_dir, tmp_path, 1)
    copy_version(version_dir, tmp_path, 2)
    _models_config(tmp_path, "all {}", {"stable": 1, "canary": 2})
    server = DevServer(tmp_path, rest_port=0, grpc_port=0, poll_seconds=0.2,
                       warmup=False).start()
    client = Grpc(server.grpc_port)
    port = server.rest_port
    try:
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
        status, body = post(port, "/v1/models/translate/labels/beta:predict",
                            {"instances": ["x"]})
        assert status == 400 and "Unrecognized servable version label: beta" in body["error"]
        assert "canary" in body["error"] and "stable" in body["error"]
        assert client.predict(grpc_request(["x"], label="beta"))[0] == "INVALID_ARGUMENT"

        # The file changes: specific {1}; version 2 stops serving, canary is gone.
        _models_config(tmp_path, "specific { versions: 1 }", {"stable": 1})
        wait_for(lambda: _state(port) == [("1", "AVAILABLE")], 30, 0.1, "version 2 retired")
        assert client.translate(SENTENCES) == (reference, 1)
        status, body = post(port, "/v1/models/translate/versions/2:predict", {"instances": ["x"]})
        assert status == 404 and "Available version(s): [1]" in body["error"]
        assert post(port, "/v1/models/translate/labels/canary:predict",
                    {"instances": ["x"]})[0] == 400
        assert rest_translate(port, SENTENCES, "/v1/models/translate/labels/stable:predict") \
            == reference

        # A broken file is ignored (logged); the last good policy stays.
        (tmp_path / "models.config").write_text("model_config_list { config { nonsense")
        time.sleep(0.5)
        assert server.manager.config_error
        assert _state(port) == [("1", "AVAILABLE")]
        assert client.translate(SENTENCES, label="stable") == (reference, 1)
    finally:
        client.close()
        server.stop(0)


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
