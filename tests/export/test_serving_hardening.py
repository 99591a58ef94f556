"""The development server under hostile input: every class of bad request on both APIs gets a
4xx (REST, with a JSON ``{"error": ...}`` body) or the matching gRPC code, at once and without
memory growth; a flood of slow clients neither grows the thread count nor delays a good
request; and the server answers correctly after each of them. Also: ``aiayn serve`` refuses a
``--host`` the stock binary cannot honour."""

from __future__ import annotations

import json
import socket
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
    read_http_answer,
    rest_translate,
    rss_mb,
    wait_for,
)

pytestmark = pytest.mark.slow

MAX_REQUEST_BYTES = 64 * 1024
MAX_CONNECTIONS = 250
TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def server(exported, tmp_path_factory):
    """A server of its own (short timeouts, small limits) over a copy of the tiny export."""
    from aiayn.export.server import DevServer

    _, version_dir = exported
    base = tmp_path_factory.mktemp("hardening")
    copy_version(version_dir, base, 1)
    server = DevServer(base, rest_port=0, grpc_port=0, poll_seconds=0.5, warmup=False,
                       batch_timeout_ms=5, max_request_bytes=MAX_REQUEST_BYTES,
                       max_connections=MAX_CONNECTIONS, header_timeout=TIMEOUT_S,
                       read_timeout=TIMEOUT_S).start()
    yield server
    server.stop(0)


@pytest.fixture(scope="module")
def reference(server):
    """The server's own translations of SENTENCES, REST and gRPC agreeing."""
    texts = rest_translate(server.rest_port, SENTENCES)
    client = Grpc(server.grpc_port)
    assert client.translate(SENTENCES)[0] == texts
    client.close()
    return texts


@pytest.fixture(scope="module")
def grpc_client(server):
    client = Grpc(server.grpc_port)
    yield client
    client.close()


def _still_answers(server, reference, grpc_client=None):
    assert rest_translate(server.rest_port, SENTENCES) == reference
    if grpc_client is not None:
        assert grpc_client.translate(SENTENCES)[0] == reference


def _request(body: bytes, headers: str = "", method: str = "POST",
             path: str = PREDICT) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}"
    if "content-length" not in headers.lower() and "transfer-encoding" not in headers.lower():
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


# -- REST: framing (the HTTP layer) ------------------------------------------------------------
FRAMING = [
    ("content-length not a number", b"POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400,
     "not a number"),
    ("content-length negative", b"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400,
     "not a number"),
    ("content-length absurd", b"POST / HTTP/1.1\r\nContent-Length: 1" + b"0" * 40 + b"\r\n\r\n",
     413, "exceeds the limit"),
    ("content-length over the cap",
     f"POST / HTTP/1.1\r\nContent-Length: {MAX_REQUEST_BYTES + 1}\r\n\r\n".encode(), 413,
     f"limit of {MAX_REQUEST_BYTES} bytes"),
    ("conflicting content-lengths",
     b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400,
     "Conflicting Content-Length"),
    ("chunked body", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
     411, "Content-Length"),
    ("unsupported method PUT", _request(b"{}", method="PUT"), 405, "not allowed"),
    ("unsupported method DELETE", _request(b"", method="DELETE"), 405, "not allowed"),
    ("malformed request line", b"HELLO\r\n\r\n", 400, "Malformed request line"),
    ("unsupported protocol", b"GET /v1/models/translate HTTP/2.0\r\n\r\n", 400,
     "Unsupported protocol"),
    ("header without colon", b"GET /v1/models/translate HTTP/1.1\r\nNoColonHere\r\n\r\n", 400,
     "Malformed header"),
    ("headers too large",
     b"GET /v1/models/translate HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431,
     "exceed"),
    ("too many headers",
     b"GET /v1/models/translate HTTP/1.1\r\n" + b"X-A: 1\r\n" * 150 + b"\r\n", 431,
     "header lines"),
]


@pytest.mark.parametrize("data, status, match", [c[1:] for c in FRAMING],
                         ids=[c[0] for c in FRAMING])
def test_rest_framing_errors_are_4xx_json(server, reference, data, status, match):
    code, headers, body = raw_http(server.rest_port, data)
    assert code == status and set(body) == {"error"}, (code, body)
    assert match in body["error"]
    assert headers["content-type"] == "application/json"
    if status == 405:
        assert headers["allow"] == "GET, POST"
    _still_answers(server, reference)


def test_rest_body_over_the_cap_is_refused_after_upload(server, reference):
    # A client that sends the whole over-sized body anyway reads the 413 (no reset).
    status, body = post(server.rest_port, PREDICT, b'{"instances": ["' + b"a" *
                        (MAX_REQUEST_BYTES + 10) + b'"]}')
    assert status == 413 and "--max-request-bytes" in body["error"]
    _still_answers(server, reference)


def test_rest_timeouts_answer_408(server, reference):
    started = time.monotonic()
    headers = socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
    headers.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nContent-Le")
    body = socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
    body.sendall(_request(b'{"instan', headers="Content-Length: 100\r\n"))
    status, _, reply = read_http_answer(headers)
    assert status == 408 and "--header-timeout" in reply["error"]
    status, _, reply = read_http_answer(body)
    assert status == 408 and "got 8 of 100 bytes" in reply["error"]
    assert TIMEOUT_S - 0.5 < time.monotonic() - started < TIMEOUT_S + 2
    headers.close()
    body.close()
    _still_answers(server, reference)


def test_rest_expect_100_continue_and_keep_alive(server, reference):
    body = json.dumps({"instances": SENTENCES}).encode()
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(_request(b"", headers=f"Content-Length: {len(body)}\r\n"
                                           "Expect: 100-continue\r\n"))
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        sock.sendall(_request(body, headers="Connection: close\r\n"))  # pipelined, same socket
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    answers = data.split(b"HTTP/1.1 ")[1:]
    assert len(answers) == 2 and all(a.startswith(b"200 OK") for a in answers)
    for answer in answers:
        payload = json.loads(answer.partition(b"\r\n\r\n")[2])
        assert [p["translation"] for p in payload["predictions"]] == reference


# -- REST: the request body and the URL (the TF Serving layer) ---------------------------------
def _nested(depth: int) -> bytes:
    return b'{"instances": ' + b"[" * depth + b'"x"' + b"]" * depth + b"}"


BODIES = [
    ("malformed JSON", b'{"instances": ["x",]', 400, "JSON Parse error"),
    ("number of 5000 digits", b'{"instances": [' + b"7" * 5000 + b"]}", 400, "out of range"),
    ("5000 nested brackets", b"[" * 5000 + b"]" * 5000, 400, "nested deeper"),
    ("40 nested lists", _nested(40), 400, "nested deeper"),
    ("NaN", b'{"instances": [NaN]}', 400, "NaN is not a JSON value"),
    ("body not UTF-8", b'{"instances": ["\xff"]}', 400, "UTF-8"),
    ("empty body", b"", 400, "body is empty"),
    ("body not an object", b'["x"]', 400, "must be a JSON object"),
    ("instances not a list", {"instances": 5}, 400, "must be a JSON list"),
    ("number instead of string", {"instances": [1, 2]}, 400, "expected type: string"),
    ("float out of range", b'{"instances": [1e999]}', 400, "expected type: string"),
    ("null instead of string", {"instances": [None]}, 400, "Type: Null"),
    ("nested list", {"instances": [["x"]]}, 400, "rank > 1"),
    ("bad base64", {"instances": [{"b64": "!!!"}]}, 400, "not valid base64"),
    ("b64 not UTF-8", {"instances": [{"b64": "/w=="}]}, 400, "UTF-8"),
    ("object with other keys", {"inputs": {"text": [{"x": 1}]}}, 400, "expected a string"),
    ("signature_name not a string", {"signature_name": 5, "instances": ["x"]}, 400,
     "must be a string"),
    ("unknown key", {"instance": ["x"]}, 400, "Did you mean 'instances'"),
    ("both forms", {"instances": ["x"], "inputs": ["x"]}, 400, "both"),
    ("unknown input name", {"instances": [{"txt": "x"}]}, 400, "Did you mean 'text'"),
    ("unknown signature", {"signature_name": "nbest", "instances": ["x"]}, 400,
     "Did you mean 'n_best'"),
    ("batch over the limit", {"instances": ["x"] * 17}, 400, "maximum input batch size 16"),
]


@pytest.mark.parametrize("body, status, match", [c[1:] for c in BODIES],
                         ids=[c[0] for c in BODIES])
def test_rest_bad_bodies_are_400(server, reference, body, status, match):
    code, reply = post(server.rest_port, PREDICT, body)
    assert code == status and set(reply) == {"error"}, (code, reply)
    assert match in reply["error"]
    _still_answers(server, reference)


URLS = [
    ("POST", "/v1/models/nope:predict", 404, "Servable not found for request: Latest(nope)"),
    ("POST", "/v1/models/translate/versions/999:predict", 404, "Specific(translate, 999)"),
    ("POST", "/v1/models/translate/versions/abc:predict", 400, "must be a non-negative"),
    ("POST", "/v1/models/translate/versions/" + "9" * 5000 + ":predict", 400,
     "must be a non-negative"),
    ("POST", "/v1/models/translate/versions/99999999999999999999:predict", 400,
     "64-bit"),
    ("POST", "/v1/models/translate/labels/canary:predict", 400,
     "Unrecognized servable version label: canary"),
    ("POST", "/v1/models/translate:classify", 400, "predict signatures only"),
    ("POST", "/v1/models/translate:explode", 404, "Malformed request"),
    ("POST", "/v2/whatever", 404, "Malformed request"),
    ("GET", "/v1/models/nope", 404, "Could not find any versions of model nope"),
    ("GET", "/v1/models/translate/versions/7", 404, "Could not find version 7"),
    ("GET", "/v1/models/translate/labels/x", 400, "Unrecognized servable version label"),
    ("GET", "/v1/models/nope/metadata", 404, "Servable not found"),
    ("GET", "/", 404, "Malformed request"),
]


@pytest.mark.parametrize("method, path, status, match", URLS,
                         ids=[f"{m} {p[:40]}" for m, p, _, _ in URLS])
def test_rest_unknown_models_versions_labels(server, reference, method, path, status, match):
    if method == "POST":
        code, reply = post(server.rest_port, path, {"instances": ["x"]})
    else:
        code, reply = get(server.rest_port, path)
    assert code == status and set(reply) == {"error"}, (code, reply)
    assert match in reply["error"]
    _still_answers(server, reference)


# -- gRPC --------------------------------------------------------------------------------------
def _tensor(request, dtype=7, dims=(1,), values=(b"x",), unknown_rank=False, content=b""):
    proto = request.inputs["text"]
    proto.Clear()
    proto.dtype = dtype
    if unknown_rank:
        proto.tensor_shape.unknown_rank = True
    for d in dims:
        proto.tensor_shape.dim.add().size = d
    proto.string_val.extend(values)
    if content:
        proto.tensor_content = content
    return request


def _grpc_case(kind):
    req = grpc_request(["x"])
    if kind == "declares 50M strings, carries one":
        return _tensor(req, dims=(50_000_000,))
    if kind == "declares 10^9 strings":
        return _tensor(req, dims=(10 ** 9,), values=())
    if kind == "DT_FLOAT":
        return _tensor(req, dtype=1, dims=(1_000_000_000,), values=())
    if kind == "rank 2":
        return _tensor(req, dims=(1, 1))
    if kind == "scalar":
        return _tensor(req, dims=())
    if kind == "unknown rank":
        return _tensor(req, unknown_rank=True)
    if kind == "negative size":
        return _tensor(req, dims=(-1,))
    if kind == "fewer values than declared":
        return _tensor(req, dims=(3,), values=(b"a", b"b"))
    if kind == "more values than declared":
        return _tensor(req, dims=(1,), values=(b"a", b"b"))
    if kind == "string tensor_content":
        return _tensor(req, dims=(0,), values=(), content=b"\x01\x02")
    if kind == "batch over the limit":
        return grpc_request(["x"] * 17)
    if kind == "not UTF-8":
        return grpc_request([b"ok", b"\xff\xfe"])
    if kind == "missing input":
        del req.inputs["text"]
        return req
    if kind == "extra input":
        req.inputs["txt"].CopyFrom(req.inputs["text"])
        return req
    if kind == "unknown signature":
        return grpc_request(["x"], signature="nbest")
    if kind == "unknown output_filter":
        req.output_filter.append("translashun")
        return req
    if kind == "unknown model":
        return grpc_request(["x"], name="nope")
    if kind == "unknown version":
        return grpc_request(["x"], version=999)
    if kind == "unknown label":
        return grpc_request(["x"], label="canary")
    if kind == "message over the cap":
        return grpc_request(["a" * (MAX_REQUEST_BYTES + 100)])
    raise AssertionError(kind)


GRPC = [
    ("declares 50M strings, carries one", "INVALID_ARGUMENT", "maximum input batch size 16"),
    ("declares 10^9 strings", "INVALID_ARGUMENT", "maximum input batch size 16"),
    ("DT_FLOAT", "INVALID_ARGUMENT", "must be DT_STRING; got DT_FLOAT"),
    ("rank 2", "INVALID_ARGUMENT", "shape [batch]; got shape [1, 1]"),
    ("scalar", "INVALID_ARGUMENT", "shape [batch]; got shape []"),
    ("unknown rank", "INVALID_ARGUMENT", "unknown rank"),
    ("negative size", "INVALID_ARGUMENT", "negative size"),
    ("fewer values than declared", "INVALID_ARGUMENT", "declares shape [3] but carries 2"),
    ("more values than declared", "INVALID_ARGUMENT", "declares shape [1] but carries 2"),
    ("string tensor_content", "INVALID_ARGUMENT", "tensor_content"),
    ("batch over the limit", "INVALID_ARGUMENT", "maximum input batch size 16"),
    ("not UTF-8", "INVALID_ARGUMENT", "not valid UTF-8"),
    ("missing input", "INVALID_ARGUMENT", "Missing but required: ['text']"),
    ("extra input", "INVALID_ARGUMENT", "Sent extra: ['txt']"),
    ("unknown signature", "INVALID_ARGUMENT", "Did you mean 'n_best'"),
    ("unknown output_filter", "INVALID_ARGUMENT", "output tensor alias not found"),
    ("unknown model", "NOT_FOUND", "Servable not found for request: Latest(nope)"),
    ("unknown version", "NOT_FOUND", "Specific(translate, 999)"),
    ("unknown label", "INVALID_ARGUMENT", "Unrecognized servable version label: canary"),
    ("message over the cap", "RESOURCE_EXHAUSTED", "larger than max"),
]


@pytest.mark.parametrize("kind, code, match", GRPC, ids=[c[0] for c in GRPC])
def test_grpc_bad_requests(server, reference, grpc_client, kind, code, match):
    request = _grpc_case(kind)
    rss_before = rss_mb()
    started = time.monotonic()
    got, details = grpc_client.predict(request)
    assert (got, match in details) == (code, True), (got, details)
    assert time.monotonic() - started < 2.0  # refused at once, nothing materialised
    assert rss_mb() - rss_before < 50
    _still_answers(server, reference, grpc_client)


def test_grpc_metadata_and_status_errors(server, grpc_client):
    from tensorflow_serving.apis import get_model_metadata_pb2

    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "translate"
    request.metadata_field.append("nonsense")
    code, details = grpc_client.call(grpc_client.predict_stub.GetModelMetadata, request)
    assert code == "INVALID_ARGUMENT" and "signature_def" in details
    assert grpc_client.status(name="nope") == (
        "NOT_FOUND", "Could not find any versions of model nope")
    code, details = grpc_client.status(version=7)
    assert code == "NOT_FOUND" and "Could not find version 7" in details
    code, details = grpc_client.status(label="x")
    assert code == "INVALID_ARGUMENT" and "Unrecognized servable version label" in details
    code, status = grpc_client.status()
    assert code == "OK" and [(s.version, s.state) for s in status.model_version_status] == [
        (1, 30)]


def test_no_request_class_made_a_5xx(server, reference):
    """After every bad request above (this module), the server counted no 5xx."""
    assert server.rest.stats["5xx"] == 0
    _still_answers(server, reference)


def _read_rest(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _parse_answer(data: bytes):
    import io

    class _Sock:
        def __init__(self):
            self.buf = io.BytesIO(data)

        def recv(self, n):
            return self.buf.read(n)

    return read_http_answer(_Sock())


# -- floods ------------------------------------------------------------------------------------
def test_flood_of_slow_clients_is_bounded(server, reference, grpc_client):
    """200 clients send headers and never the body: no thread per client, a good request is
    answered quickly meanwhile, each slow client gets a 408 at its read timeout, and clients
    past the connection cap get a 503 at once."""
    _still_answers(server, reference, grpc_client)  # every pool thread started
    before = threading.active_count()
    slow = []
    with ThreadSampler() as sampler:
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
            sock.sendall(_request(b"", headers="Content-Length: 100\r\n"))
            slow.append(sock)
        wait_for(lambda: server.rest.open_connections >= 200, 5, what="200 open connections")
        started = time.monotonic()
        assert rest_translate(server.rest_port, SENTENCES) == reference
        assert grpc_client.translate(SENTENCES)[0] == reference
        good_seconds = time.monotonic() - started
        # Past the cap: 250 open at most; the extra ones are answered 503 and closed.
        extra = [socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
                 for _ in range(MAX_CONNECTIONS - 200 + 10)]
        time.sleep(0.5)
        answers = []
        for sock in extra:
            sock.setblocking(False)
            try:
                first = sock.recv(65536)
            except BlockingIOError:
                continue  # accepted (under the cap): it idles out at the header timeout
            sock.settimeout(5)
            answers.append(_parse_answer(first + _read_rest(sock)))
        statuses = [a[0] for a in answers]
    assert sampler.max - before <= 4, (before, sampler.max)  # not one per client
    assert good_seconds < 5.0
    assert len(statuses) >= 10 and set(statuses) == {503}
    assert all("--max-connections" in a[2]["error"] and a[1]["retry-after"] == "1"
               for a in answers)
    for sock in slow:
        sock.settimeout(10)
    replies = [read_http_answer(sock) for sock in slow]
    assert [r[0] for r in replies] == [408] * 200
    assert all("got 0 of 100 bytes" in r[2]["error"] for r in replies)
    for sock in slow + extra:
        sock.close()
    wait_for(lambda: server.rest.open_connections == 0, 10, what="the connections to close")
    assert threading.active_count() <= before
    _still_answers(server, reference, grpc_client)


def test_flood_of_silent_connections_is_dropped(server, reference):
    """Connections that never send a byte cost no thread and are closed at the header timeout."""
    before = threading.active_count()
    silent = [socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
              for _ in range(100)]
    wait_for(lambda: server.rest.open_connections >= 100, 5, what="100 open connections")
    assert threading.active_count() <= before
    assert rest_translate(server.rest_port, SENTENCES) == reference
    for sock in silent:
        assert sock.recv(10) == b""  # closed by the server, nothing to answer
        sock.close()


# -- aiayn serve and the stock binary ----------------------------------------------------------
def test_stock_binary_refuses_a_host_it_cannot_honour(monkeypatch, tmp_path):
    from aiayn.pipeline.errors import UserInputError
    from aiayn.pipeline.release import commands

    monkeypatch.setattr(commands.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(UserInputError, match="binds all interfaces") as err:
        commands.serve_command(tmp_path, host="127.0.0.1")
    assert "--allow-all-interfaces" in str(err.value)
    kind, command = commands.serve_command(tmp_path, host="127.0.0.1",
                                           allow_all_interfaces=True)
    assert kind == "tensorflow_model_server" and command[0] == "tensorflow_model_server"
    assert commands.serve_command(tmp_path, host="0.0.0.0")[0] == "tensorflow_model_server"
    with pytest.raises(UserInputError, match="binds all interfaces"):
        commands.serve_command(tmp_path, host="10.0.0.5", backend="tfs")
