"""The development server end to end: REST (both forms), gRPC, hot versions, bad inputs."""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request

import pytest

from tests.export.conftest import decode

pytestmark = pytest.mark.slow

SENTENCES = ["I love you.", "", "  ", "God saw the light.", "我爱你"]


def _post(server, path, body, raw=False):
    data = body if raw else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(f"http://127.0.0.1:{server.rest_port}{path}", data=data,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _get(server, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.rest_port}{path}") as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


PREDICT = "/v1/models/translate:predict"
LONG_TEXT = " ".join(["God saw the light and it was good."] * 12)


@pytest.fixture(scope="module")
def expected(translator):
    out = translator.translate(SENTENCES)
    return decode(out["translation"]), out["score"].tolist()


def test_rest_instances_form_matches_in_process(dev_server, expected):
    status, body = _post(dev_server, PREDICT, {"instances": SENTENCES})
    assert status == 200, body
    texts, scores = expected
    assert [p["translation"] for p in body["predictions"]] == texts
    assert [p["score"] for p in body["predictions"]] == pytest.approx(scores, abs=1e-4)
    assert texts[1] == texts[2] == ""  # empty and whitespace: empty output, not an error
    status, body = _post(dev_server, PREDICT, {"instances": [{"text": t} for t in SENTENCES]})
    assert status == 200 and [p["translation"] for p in body["predictions"]] == texts


def test_rest_inputs_form_and_n_best(dev_server, expected):
    status, body = _post(dev_server, PREDICT, {"inputs": {"text": SENTENCES}})
    assert status == 200, body
    assert body["outputs"]["translation"] == expected[0]
    status, body = _post(dev_server, PREDICT, {"signature_name": "n_best", "inputs": SENTENCES})
    assert status == 200, body
    assert [row[0] for row in body["outputs"]["translations"]] == expected[0]
    assert len(body["outputs"]["scores"][0]) == 2
    assert body["outputs"]["unknown_fraction"] == [0.0] * len(SENTENCES)  # all known scripts


def test_grpc_predict_metadata_status(dev_server, expected, exported):
    from aiayn.export.client import GrpcClient, ServingClientError

    client = GrpcClient(f"127.0.0.1:{dev_server.grpc_port}")
    results = client.translate(SENTENCES)
    assert [r.text for r in results] == expected[0]
    assert [r.score for r in results] == pytest.approx(expected[1], abs=1e-4)
    unknown = client.translate(["Привет мир", "I love Привет"], n_best=True)
    assert [r.unknown_fraction for r in unknown] == pytest.approx([1.0, 6 / 11])
    meta = client.metadata()
    assert meta.model_spec.name == "translate"
    status = client.status()
    assert status.model_version_status[0].state == 30  # AVAILABLE
    with pytest.raises(ServingClientError) as err:
        client.predict([b"ok", b"\xff\xfe"])
    assert err.value.code == "INVALID_ARGUMENT" and "UTF-8" in err.value.message
    client.close()


def test_rest_status_and_metadata(dev_server, exported):
    _, path = exported
    status, body = _get(dev_server, "/v1/models/translate")
    assert status == 200
    assert body["model_version_status"][0]["state"] == "AVAILABLE"
    status, body = _get(dev_server, f"/v1/models/translate/versions/{path.name}/metadata")
    assert status == 200
    sigs = body["metadata"]["signature_def"]["signature_def"]
    assert sigs["serving_default"]["inputs"]["text"]["dtype"] == "DT_STRING"


def test_concurrent_requests_are_batched(dev_server, expected):
    from aiayn.export.client import RestClient

    client = RestClient(f"http://127.0.0.1:{dev_server.rest_port}")
    servable = dev_server.manager.get("translate")
    batcher = servable.batchers["serving_default"]
    before = batcher.batches_run
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda t: client.translate([t])[0].text, SENTENCES * 2))
    assert results == expected[0] * 2
    assert batcher.batches_run - before < len(results)  # some requests shared a batch


@pytest.mark.parametrize("body, code, match", [
    ({"instances": [{"b64": "/w=="}]}, 400, "UTF-8"),
    ({"instances": [1, 2]}, 400, "expected type: string"),
    ({"instances": [["nested"]]}, 400, "shape"),
    ({"inputs": {"text": "not a list"}}, 400, "vector"),
    ({"instance": ["misspelled"]}, 400, "Did you mean 'instances'"),
    ({"instances": [{"txt": "misspelled"}]}, 400, "Did you mean 'text'"),
    ({"signature_name": "nbest", "instances": ["x"]}, 400, "Did you mean 'n_best'"),
    ({}, 400, "Missing 'inputs' or 'instances'"),
    ({"instances": ["x"] * 17}, 400, "maximum input batch size 16"),
])
def test_rest_bad_inputs(dev_server, body, code, match):
    status, reply = _post(dev_server, PREDICT, body)
    assert status == code and set(reply) == {"error"}, reply
    assert match in reply["error"]
    assert _post(dev_server, PREDICT, {"instances": ["still up"]})[0] == 200


def test_rest_bad_bytes_and_unknown_servables(dev_server):
    status, reply = _post(dev_server, PREDICT, b'{"instances": ["\xff"]}', raw=True)
    assert status == 400 and "UTF-8" in reply["error"]
    status, reply = _post(dev_server, "/v1/models/nope:predict", {"instances": ["x"]})
    assert status == 404 and reply["error"] == "Servable not found for request: Latest(nope)"
    status, reply = _post(dev_server, "/v1/models/translate/versions/999:predict",
                          {"instances": ["x"]})
    assert status == 404 and "Specific(translate, 999)" in reply["error"]
    assert _get(dev_server, "/v1/models/nope")[0] == 404


def test_long_input_is_truncated_and_said_so(dev_server):
    status, reply = _post(dev_server, PREDICT, {"signature_name": "n_best",
                                                "instances": [LONG_TEXT, "I love you."]})
    assert status == 200 and [p["truncated"] for p in reply["predictions"]] == [True, False]


@pytest.fixture(scope="module")
def second_version(dev_server, exported, trained_model, toy_tokenizer):
    """A new version, exported while the server runs, that REJECTS over-long input."""
    from aiayn.export import saved_model as sm

    cfg, path = exported
    new = sm.export_saved_model(trained_model, toy_tokenizer, cfg.export.base_dir,
                                cfg.export.model_name,
                                options=sm.ServingOptions(beam_size=1, n_best=1,
                                                          max_input_tokens=8,
                                                          on_long_input="reject",
                                                          max_batch_size=16))
    return int(path.name), new


def test_new_version_is_served_without_restart(dev_server, second_version):
    old, new = second_version
    assert int(new.name) == old + 1
    deadline = time.time() + 60
    while time.time() < deadline:
        status, body = _get(dev_server, "/v1/models/translate")
        newest = body["model_version_status"][0]  # newest first; LOADING before AVAILABLE
        if newest["version"] == new.name and newest["state"] == "AVAILABLE":
            break
        time.sleep(0.3)
    assert body["model_version_status"][0]["version"] == new.name
    status, reply = _post(dev_server, PREDICT, {"instances": ["I love you."]})
    assert status == 200
    status, reply = _post(dev_server, f"/v1/models/translate/versions/{old}:predict",
                          {"instances": ["x"]})
    assert status == 404  # latest-only policy, as TF Serving's default


def test_long_input_rejected_when_configured(dev_server, second_version):
    import tensorflow as tf

    from aiayn.export.client import LocalClient

    _, new = second_version
    with pytest.raises(tf.errors.InvalidArgumentError, match="too long"):  # in-graph assertion
        LocalClient(new).translate([LONG_TEXT])
    status, reply = _post(dev_server, f"/v1/models/translate/versions/{new.name}:predict",
                          {"instances": ["I love you", LONG_TEXT]})
    assert status == 400 and "too long" in reply["error"] and "element 1" in reply["error"]
    assert _post(dev_server, PREDICT, {"instances": ["Jesus wept."]})[0] == 200
