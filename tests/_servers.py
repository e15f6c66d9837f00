"""Real servers for the remote-storage tests, bound to 127.0.0.1, started and stopped by the tests.

- :class:`RangeServer`: a static file server with HTTP Range support written here, which counts
  the requests and bytes it serves, adds latency, and injects faults (dropped connections, 503s,
  stalls) in the order the test queues them; ``honour_range=False`` makes it a server that ignores
  Range, as Python's ``http.server`` does (the whole file for every GET, no ``Accept-Ranges``). Every server bounds its requests: past
  ``max_requests`` it answers 429 and the test sees it.
- :func:`moto_s3`: moto's S3-compatible server (what s3fs's own tests run), on a free port.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import os
import re
import socket
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class RangeServer:
    """Serves the files under ``root`` at ``http://127.0.0.1:<port>/<relative path>``."""

    def __init__(self, root: str, *, latency: float = 0.0, max_requests: int = 20_000,
                 honour_range: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.honour_range = honour_range
        self.latency = latency
        self.max_requests = max_requests
        self.faults: deque[tuple[str, float]] = deque()  # ("drop" | "503" | "stall", seconds)
        self.broken: set[str] = set()  # relative paths that always answer 503
        self.requests = 0
        self.gets = 0
        self.bytes_sent = 0
        self.ranges: list[tuple[str, int, int]] = []  # (path, start, end) of every GET
        self.faults_hit = 0
        self.inflight = self.max_inflight = 0  # requests being answered at once
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _file(self) -> str | None:
                rel = self.path.split("?", 1)[0].lstrip("/")
                full = os.path.abspath(os.path.join(server.root, rel))
                return full if full.startswith(server.root + os.sep) and os.path.isfile(full) else None

            def do_HEAD(self) -> None:
                self._counted(head=True)

            def do_GET(self) -> None:
                self._counted(head=False)

            def _counted(self, head: bool) -> None:
                with server._lock:
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                try:
                    if self._begin():
                        self._answer(head)
                finally:
                    with server._lock:
                        server.inflight -= 1

            def _begin(self) -> bool:
                """Count the request and play the next fault; False when it took the request."""
                with server._lock:
                    server.requests += 1
                    over = server.requests > server.max_requests
                    fault = server.faults.popleft() if server.faults else None
                    server.faults_hit += fault is not None
                if server.latency:
                    time.sleep(server.latency)
                if over:
                    self._status(429)
                    return False
                if self.path.split("?", 1)[0].lstrip("/") in server.broken:
                    self._status(503)
                    return False
                if fault is None:
                    return True
                kind, seconds = fault
                if kind == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return False
                if kind == "503":
                    self._status(503)
                    return False
                time.sleep(seconds)  # "stall": then answer as usual (the client may have given up)
                return True

            def _status(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _headers(self, path: str, code: int, length: int, extra: dict) -> None:
                st = os.stat(path)
                self.send_response(code)
                self.send_header("Content-Length", str(length))
                if server.honour_range:
                    self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", '"' + hashlib.md5(f"{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest() + '"')
                self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()

            def _answer(self, head: bool) -> None:
                path = self._file()
                if path is None:
                    return self._status(404)
                if head:
                    return self._headers(path, 200, os.path.getsize(path), {})
                size = os.path.getsize(path)
                start, end, code, extra = 0, size, 200, {}
                m = _RANGE.match(self.headers.get("Range", "")) if server.honour_range else None
                if m:
                    start = int(m[1])
                    end = min(size, int(m[2]) + 1) if m[2] else size
                    if start >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    code, extra = 206, {"Content-Range": f"bytes {start}-{end - 1}/{size}"}
                with open(path, "rb") as f:
                    data = os.pread(f.fileno(), end - start, start)
                # Counted before it is sent: a client that has read the answer must find it counted
                # (counted after, a busy machine let a test's next read start first and see it late).
                with server._lock:
                    server.gets += 1
                    server.bytes_sent += len(data)
                    server.ranges.append((os.path.relpath(path, server.root), start, end))
                self._headers(path, code, len(data), extra)
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:
                pass  # a client that gave up on a stalled answer: the test counts what matters

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def url(self, rel: str) -> str:
        return f"http://127.0.0.1:{self.port}/{rel}"

    def bytes_for(self, rel: str) -> int:
        with self._lock:
            return sum(e - s for p, s, e in self.ranges if p == rel)

    def reset_counts(self) -> None:
        with self._lock:
            self.requests = self.gets = self.bytes_sent = self.faults_hit = self.max_inflight = 0
            self.ranges.clear()

    def __enter__(self) -> "RangeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3():
    """moto's S3 server on 127.0.0.1, and the storage_options that reach it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield {"key": "testing-key", "secret": "testing-secret-value",
               "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "eu-west-1"}}
    finally:
        server.stop()
