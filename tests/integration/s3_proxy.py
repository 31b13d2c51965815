"""Real HTTP proxies that misbehave on purpose: an S3 endpoint that ignores conditional writes (drops
If-Match and If-None-Match, the way some S3-compatible servers accept and ignore them), one that loses
answers, one that is slow to answer, one that can be cut off."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

DROPPED = frozenset({"if-match", "if-none-match"})
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"})


def _handler(upstream: str, dropped: frozenset[str] = DROPPED,
             lose_answer: Callable[[str, str], bool] | None = None,
             delay_s: Callable[[str, str], float] | None = None,
             refuse: Callable[[], bool] | None = None) -> type[BaseHTTPRequestHandler]:
    parts = urlsplit(upstream)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length) if length else None
            if refuse is not None and refuse():
                self.close_connection = True  # a store out of reach: the request never gets there, no answer
                return
            if delay_s is not None:
                time.sleep(delay_s(self.command, self.path))  # a server slow to take this request in
            headers = {name: value for name, value in self.headers.items()
                       if name.lower() not in dropped | HOP_BY_HOP}
            connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                if lose_answer is not None and lose_answer(self.command, self.path):
                    self.close_connection = True  # the request landed; its answer is lost on the way back
                    return
                self.send_response(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() not in HOP_BY_HOP | {"content-length"}:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                connection.close()

        # http.server dispatches on these names.
        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815

    return Forward


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served from a thread on a free loopback port, for as long as the block runs; its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def ignoring_conditions(upstream: str) -> Iterator[str]:
    """The URL of a proxy to ``upstream`` that strips If-Match and If-None-Match from every request."""
    with serving(_handler(upstream)) as url:
        yield url


@contextmanager
def losing_answers(upstream: str, lose: Callable[[str, str], bool]) -> Iterator[str]:
    """The URL of a proxy to ``upstream`` that forwards everything and, for the requests ``lose(method,
    path)`` picks, drops the answer: the request took effect, the client sees a closed connection."""
    with serving(_handler(upstream, frozenset(), lose)) as url:
        yield url


@contextmanager
def slow_to_answer(upstream: str, delay_s: Callable[[str, str], float]) -> Iterator[str]:
    """The URL of a proxy to ``upstream`` that holds each request ``delay_s(method, path)`` seconds before
    forwarding it: a loaded server, slow but answering."""
    with serving(_handler(upstream, frozenset(), None, delay_s)) as url:
        yield url


@contextmanager
def cut_off_while(upstream: str, cut: Callable[[], bool]) -> Iterator[str]:
    """The URL of a proxy to ``upstream`` that, while ``cut()`` is true, forwards nothing and closes each
    connection unanswered: the store out of reach of this client, then back."""
    with serving(_handler(upstream, frozenset(), refuse=cut)) as url:
        yield url
