"""A bounded HTTP/1.1 server: one I/O thread, a fixed pool of workers, hard limits everywhere.

The REST front end of the development server runs on it
(:func:`aiayn.export.rest.make_rest_server`).
Python's ``ThreadingHTTPServer`` starts a thread per connection and reads requests with blocking
calls, so 200 clients that send headers and never the body hold 200 threads. Here:

* one I/O thread accepts connections and reads every request with non-blocking sockets until it
  is complete (request line, headers and ``Content-Length`` bytes of body); only then does a
  worker see it. A slow or silent client costs a buffer, never a thread;
* a fixed pool of ``workers`` threads runs the handler; their answers go back to the I/O thread,
  which writes them without blocking (a client that does not read cannot hold a worker either);
* limits (:class:`HttpLimits`): at most ``max_connections`` open connections (more are answered
  503 with ``Retry-After`` and closed), ``max_header_bytes`` of request line and headers (431),
  ``max_request_bytes`` of body (413, before reading it), ``header_timeout`` seconds to receive
  the headers and ``read_timeout`` seconds more for the body (408), ``write_timeout`` for the
  answer; idle keep-alive connections close after ``header_timeout``;
* every framing error a client can make gets a 4xx with a JSON ``{"error": ...}`` body:
  unparsable or absurd ``Content-Length`` (400/413), chunked bodies (411), a malformed request
  line or header (400), a method the server does not serve (405 with ``Allow``).

:meth:`PooledHTTPServer.close` drains: it stops accepting, closes idle connections, lets
requests already received finish (up to a timeout) and then closes everything.

Only the standard library; the handler is any ``handler(HttpRequest) -> HttpResponse``.

Why one module of about 600 lines: it is one state machine (a connection's states, the selector
loop that moves it between them, and the limits it enforces at each step). Its invariants (a
worker never touches a socket, every connection is closed exactly once, every client fault is
answered before the close) hold across all of it and are easier to check in one place.
"""

from __future__ import annotations

import collections
import dataclasses
import email.utils
import errno
import http
import json
import logging
import queue
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger("aiayn.export.server")

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class HttpLimits:
    """The REST server's limits (defaults in the spirit of TF Serving's REST server).

    Attributes:
      workers: handler threads (the REST API's ``--rest_api_num_threads``).
      max_connections: open connections at once; more are answered 503 and closed.
      max_request_bytes: the largest request body (``Content-Length``) accepted; larger: 413.
      max_header_bytes: request line plus headers; larger: 431.
      max_headers: header lines; more: 431.
      header_timeout: seconds from connecting (or from the previous answer, on a kept-alive
        connection) until the headers must have arrived; then 408 (or a silent close if the
        client sent nothing).
      read_timeout: seconds from the end of the headers until the whole body must have
        arrived; then 408.
      write_timeout: seconds to write an answer to a client that does not read it.
      linger_seconds: after an error answer, how long unread input is discarded before the
        socket is closed (so the client reads the answer instead of a connection reset).
    """

    workers: int = 32
    max_connections: int = 512
    max_request_bytes: int = 4 * MiB
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0
    read_timeout: float = 30.0
    write_timeout: float = 30.0
    linger_seconds: float = 2.0

    def __post_init__(self):
        for name in ("workers", "max_connections", "max_request_bytes", "max_header_bytes",
                     "max_headers"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"HttpLimits.{name} must be at least 1; got "
                                 f"{getattr(self, name)}.")
        for name in ("header_timeout", "read_timeout", "write_timeout"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"HttpLimits.{name} must be positive; got "
                                 f"{getattr(self, name)}.")


@dataclasses.dataclass
class HttpRequest:
    """A complete request: what the handler gets."""

    method: str
    target: str  # the request target as sent, e.g. "/v1/models/x:predict?y"
    version: str  # "HTTP/1.1" or "HTTP/1.0"
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    client: tuple = ()

    @property
    def path(self) -> str:
        target = self.target
        if target.startswith(("http://", "https://")):  # absolute-form
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        return target.split("?", 1)[0]


@dataclasses.dataclass
class HttpResponse:
    """An answer: status, body and extra headers; ``close`` ends the connection after it."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False


def json_response(status: int, payload, headers: Iterable[tuple[str, str]] = (),
                  close: bool = False) -> HttpResponse:
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    return HttpResponse(status, body, headers=tuple(headers), close=close)


def error_response(status: int, message: str, headers: Iterable[tuple[str, str]] = (),
                   close: bool = False) -> HttpResponse:
    """TF Serving's error shape: ``{"error": message}``."""
    return json_response(status, {"error": message}, headers, close)


class _ClientError(Exception):
    """A framing error: answered with ``response`` and the connection is closed."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()):
        super().__init__(message)
        self.response = error_response(status, message, headers, close=True)


# Connection states.
_HEADERS, _BODY, _PROCESSING, _WRITING, _LINGER = range(5)
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_VERSION = re.compile(r"^HTTP/1\.[01]$")
_HEAD_END = re.compile(rb"\r?\n\r?\n")


class _Conn:
    __slots__ = ("sock", "addr", "buf", "state", "deadline", "out", "close_after", "events",
                 "method", "target", "version", "headers", "need", "keep_alive", "scanned",
                 "head_method")

    def __init__(self, sock: socket.socket, addr, deadline: float):
        self.sock = sock
        self.addr = addr
        self.buf = bytearray()
        self.state = _HEADERS
        self.deadline = deadline
        self.out = memoryview(b"")
        self.close_after = False
        self.events = 0
        self.method = self.target = self.version = ""
        self.headers: dict[str, str] = {}
        self.need = 0
        self.keep_alive = False
        self.scanned = 0  # bytes of buf already searched for the end of the headers
        self.head_method = False


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class PooledHTTPServer:
    """HTTP/1.1 with keep-alive over one I/O thread and ``limits.workers`` handler threads.

    Args:
      address: ``(host, port)``; port 0 picks a free one (see :attr:`server_address`).
      handler: ``handler(HttpRequest) -> HttpResponse``; runs on a worker thread. An exception
        it raises becomes a logged 500.
      limits: :class:`HttpLimits`.
      methods: the methods served; others get 405 before their body is read.
      name: thread name prefix.
    """

    def __init__(self, address: tuple[str, int], handler: Callable[[HttpRequest], HttpResponse],
                 limits: HttpLimits = HttpLimits(), methods: Iterable[str] = ("GET", "POST"),
                 name: str = "rest"):
        self.handler = handler
        self.limits = limits
        self.methods = tuple(methods)
        self.name = name
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listen = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listen.bind((host, port))
            self._listen.listen(min(socket.SOMAXCONN, 1024))
            self._listen.setblocking(False)
        except OSError:
            self._listen.close()
            raise
        self.server_address = self._listen.getsockname()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._conns: dict[int, _Conn] = {}
        self._done: collections.deque = collections.deque()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = False
        self._drain_deadline = float("inf")
        self._listening = True
        self._accept_paused_until = 0.0
        self._last_overload_log = 0.0
        self._workers: list[threading.Thread] = []
        self._io: threading.Thread | None = None
        self.stats = collections.Counter()

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> PooledHTTPServer:
        self._sel.register(self._listen, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        for i in range(self.limits.workers):
            thread = threading.Thread(target=self._work, name=f"{self.name}-worker-{i}",
                                      daemon=True)
            thread.start()
            self._workers.append(thread)
        self._io = threading.Thread(target=self._loop, name=f"{self.name}-io", daemon=True)
        self._io.start()
        return self

    def close(self, drain_timeout: float = 0.0) -> None:
        """Stops accepting; lets received requests finish (up to `drain_timeout` s); closes."""
        if self._io is None:
            self._listen.close()
            return
        self._drain_deadline = time.monotonic() + max(0.0, drain_timeout)
        self._stopping = True
        self._wake()
        self._io.join()
        for _ in self._workers:
            self._jobs.put(None)
        deadline = time.monotonic() + 1.0  # idle workers exit at once; a stuck one is a daemon
        for thread in self._workers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    # -- workers -------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, request = job
            try:
                response = self.handler(request)
            except Exception:  # noqa: BLE001 - a handler bug is a 500, never a dead worker
                log.exception("%s %s failed", request.method, _clip(request.target))
                response = error_response(500, "Internal server error (logged by the server).")
            self._done.append((conn, response))
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already woken, or closing

    # -- the I/O loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        next_sweep = 0.0
        while True:
            now = time.monotonic()
            if self._stopping:
                self._begin_drain()
                busy = any(c.state != _LINGER for c in self._conns.values())
                if not busy or now >= self._drain_deadline:
                    break
            if not self._listening and not self._stopping and now >= self._accept_paused_until:
                self._sel.register(self._listen, selectors.EVENT_READ, "listen")
                self._listening = True
            try:
                events = self._sel.select(timeout=0.1)
            except OSError as err:  # e.g. EINTR on old Pythons
                log.debug("select: %s", err)
                continue
            for key, mask in events:
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    self._drain_wake()
                else:
                    conn = key.data
                    if mask & selectors.EVENT_READ and conn.state in (_HEADERS, _BODY, _LINGER):
                        self._on_read(conn)
                    if mask & selectors.EVENT_WRITE and conn.state == _WRITING:
                        self._on_write(conn)
            while self._done:
                conn, response = self._done.popleft()
                if self._conns.get(conn.sock.fileno()) is conn:
                    self._respond(conn, response)
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + 0.1
        for conn in list(self._conns.values()):
            self._close(conn)
        if self._listening:
            self._sel.unregister(self._listen)
        self._listen.close()

    def _begin_drain(self) -> None:
        if self._listening:
            self._sel.unregister(self._listen)
            self._listening = False
            self._listen.close()
            self._listen = socket.socket()  # a closed placeholder for the final close()
        for conn in list(self._conns.values()):
            if conn.state == _HEADERS and not conn.buf:
                self._close(conn)  # idle keep-alive: nothing in flight

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listen.accept()
            except BlockingIOError:
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: stop accepting for a moment instead of spinning.
                    log.warning("REST server cannot accept a connection (%s); pausing accepts "
                                "for 0.5 s.", err)
                    self._sel.unregister(self._listen)
                    self._listening = False
                    self._accept_paused_until = time.monotonic() + 0.5
                return
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            if len(self._conns) >= self.limits.max_connections:
                self.stats["refused_connections"] += 1
                now = time.monotonic()
                if now - self._last_overload_log > 5:
                    self._last_overload_log = now
                    log.warning("REST server at its connection limit (%d, --max-connections); "
                                "answering 503 to new connections.", self.limits.max_connections)
                payload = _serialize(error_response(
                    503, f"The server has {self.limits.max_connections} open connections, its "
                         "limit (--max-connections); retry shortly.",
                    headers=(("Retry-After", "1"),), close=True), head=False)
                try:
                    sock.send(payload)
                except OSError:
                    pass
                sock.close()
                continue
            conn = _Conn(sock, addr, time.monotonic() + self.limits.header_timeout)
            self._conns[sock.fileno()] = conn
            self._watch(conn, selectors.EVENT_READ)
            self.stats["connections"] += 1

    def _watch(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if conn.events:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.events = 0
        self._conns.pop(fd, None)
        try:
            conn.sock.close()
        except OSError:
            pass

    def _on_read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:  # the client closed (or half-closed) its side
            self._close(conn)
            return
        if conn.state == _LINGER:
            return  # discard unread input after an error answer
        conn.buf += data
        try:
            self._advance(conn)
        except _ClientError as err:
            self.stats["framing_errors"] += 1
            self._respond(conn, err.response)

    def _advance(self, conn: _Conn) -> None:
        """Parses what has arrived; hands a complete request to a worker."""
        limits = self.limits
        if conn.state == _HEADERS:
            if conn.scanned == 0 and conn.buf[:1] in (b"\r", b"\n"):
                # Stray line breaks before a request line are allowed (RFC 9112, 2.2).
                del conn.buf[:len(conn.buf) - len(conn.buf.lstrip(b"\r\n"))]
            match = _HEAD_END.search(conn.buf, max(0, conn.scanned - 3),
                                     limits.max_header_bytes + 4)
            if match is None:
                if len(conn.buf) > limits.max_header_bytes:
                    raise _ClientError(431, f"Request line and headers exceed "
                                            f"{limits.max_header_bytes} bytes.")
                conn.scanned = len(conn.buf)
                return
            head = bytes(conn.buf[:match.start()])
            del conn.buf[:match.end()]
            conn.scanned = 0
            self._parse_head(conn, head)
            conn.state = _BODY
            conn.deadline = time.monotonic() + limits.read_timeout
            if (conn.need > len(conn.buf) and conn.version == "HTTP/1.1"
                    and conn.headers.get("expect", "").lower() == "100-continue"):
                try:
                    conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                except OSError:
                    pass
        if conn.state == _BODY:
            if len(conn.buf) < conn.need:
                return
            body = bytes(conn.buf[:conn.need])
            del conn.buf[:conn.need]
            conn.state = _PROCESSING
            conn.deadline = float("inf")
            self._watch(conn, 0)
            request = HttpRequest(conn.method, conn.target, conn.version, conn.headers, body,
                                  conn.addr)
            self.stats["requests"] += 1
            self._jobs.put((conn, request))

    def _parse_head(self, conn: _Conn, head: bytes) -> None:
        lines = head.replace(b"\r\n", b"\n").split(b"\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1]:
            raise _ClientError(400, "Malformed request line "
                                    f"{_clip(lines[0].decode('latin-1'))!r}; expected "
                                    "'METHOD /path HTTP/1.1'.")
        method, target, version = (p.decode("latin-1") for p in parts)
        if not _VERSION.match(version):
            raise _ClientError(400, f"Unsupported protocol {_clip(version)!r}; send HTTP/1.1 "
                                    "or HTTP/1.0.")
        if not (target.startswith("/") or target.startswith(("http://", "https://"))):
            raise _ClientError(400, f"Malformed request target {_clip(target)!r}; expected a "
                                    "path such as /v1/models/<name>:predict.")
        if len(lines) - 1 > self.limits.max_headers:
            raise _ClientError(431, f"More than {self.limits.max_headers} header lines.")
        headers: dict[str, str] = {}
        lengths: list[str] = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.match(name):
                raise _ClientError(400, "Malformed header line "
                                        f"{_clip(line.decode('latin-1'))!r}.")
            key = name.decode("latin-1").lower()
            text = value.strip(b" \t").decode("latin-1")
            if key == "content-length":
                lengths.append(text)
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        conn.method, conn.target, conn.version, conn.headers = method, target, version, headers
        conn.head_method = method == "HEAD"
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        conn.keep_alive = ("close" not in tokens if version == "HTTP/1.1"
                           else "keep-alive" in tokens)
        if method not in self.methods:
            raise _ClientError(405, f"Method {_clip(method)} is not allowed; this server "
                                    f"answers {', '.join(self.methods)}.",
                               headers=(("Allow", ", ".join(self.methods)),))
        if "transfer-encoding" in headers:
            raise _ClientError(411, "Transfer-Encoding "
                                    f"{_clip(headers['transfer-encoding'])!r} is not supported; "
                                    "send the body with a Content-Length header.")
        conn.need = self._content_length(lengths)

    def _content_length(self, values: list[str]) -> int:
        limit = self.limits.max_request_bytes
        if not values:
            return 0
        if len(set(values)) > 1:
            raise _ClientError(400, f"Conflicting Content-Length headers: {_clip(str(values))}.")
        text = values[0]
        if not text.isascii() or not text.isdigit():
            raise _ClientError(400, f"Content-Length {_clip(text)!r} is not a number of bytes.")
        if len(text) > 15 or int(text) > limit:
            raise _ClientError(413, f"The request body of {_clip(text, 20)} bytes exceeds the "
                                    f"limit of {limit} bytes (--max-request-bytes).")
        return int(text)

    def _respond(self, conn: _Conn, response: HttpResponse) -> None:
        close = (response.close or not conn.keep_alive or self._stopping
                 or conn.state not in (_PROCESSING,))
        if response.status >= 500:
            self.stats["5xx"] += 1
        data = _serialize(dataclasses.replace(response, close=close), head=conn.head_method)
        conn.out = memoryview(data)
        conn.close_after = close
        conn.state = _WRITING
        conn.deadline = time.monotonic() + self.limits.write_timeout
        self._on_write(conn)

    def _on_write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if len(conn.out):
            self._watch(conn, selectors.EVENT_WRITE)
            return
        if conn.close_after:
            self._linger(conn)
            return
        # Kept alive: wait for the next request (which may already be buffered).
        conn.state = _HEADERS
        conn.deadline = time.monotonic() + self.limits.header_timeout
        conn.method = conn.target = ""
        conn.need = 0
        self._watch(conn, selectors.EVENT_READ)
        if conn.buf:
            try:
                self._advance(conn)
            except _ClientError as err:
                self._respond(conn, err.response)

    def _linger(self, conn: _Conn) -> None:
        """Half-closes and discards input for a moment, so the client reads our answer."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state = _LINGER
        conn.buf = bytearray()
        conn.deadline = time.monotonic() + self.limits.linger_seconds
        self._watch(conn, selectors.EVENT_READ)

    def _sweep(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if now < conn.deadline:
                continue
            if conn.state == _HEADERS and not conn.buf:
                self._close(conn)  # idle (or never spoke): nothing to answer
            elif conn.state == _HEADERS:
                self.stats["timeouts"] += 1
                self._respond(conn, error_response(
                    408, f"The request headers did not arrive within "
                         f"{self.limits.header_timeout:g} s (--header-timeout).", close=True))
            elif conn.state == _BODY:
                self.stats["timeouts"] += 1
                self._respond(conn, error_response(
                    408, f"The request body did not arrive within {self.limits.read_timeout:g} s "
                         f"(--read-timeout): got {len(conn.buf)} of {conn.need} bytes.",
                    close=True))
            else:  # writing to a client that does not read, or lingering: give up
                self._close(conn)


def _serialize(response: HttpResponse, head: bool) -> bytes:
    try:
        reason = http.HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {response.status} {reason}",
             f"Date: {email.utils.formatdate(usegmt=True)}",
             "Server: aiayn-dev-serving/2",
             f"Content-Type: {response.content_type}",
             f"Content-Length: {len(response.body)}",
             f"Connection: {'close' if response.close else 'keep-alive'}"]
    lines += [f"{k}: {v}" for k, v in response.headers]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return data if head else data + response.body
