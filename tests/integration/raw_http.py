"""A raw-socket HTTP/1.1 client for hostile-input tests: sends any bytes, parses what comes back."""

from __future__ import annotations

import json
import socket
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools


@dataclass
class Answer:
    """One parsed response."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def error(self) -> dict[str, Any]:
        """The JSON error object of an error answer."""
        document: dict[str, Any] = json.loads(self.body)["error"]
        return document


class PeerClosed(Exception):
    """The router closed the connection before a complete answer."""


class RawConnection:
    """One TCP connection to the router; answers are parsed as they arrive, in order."""

    def __init__(self, port: int, *, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.parser = httptools.HttpResponseParser(self)
        self.answers: deque[Answer] = deque()
        self.current = Answer(0)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.current.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.current.body += body

    def on_message_complete(self) -> None:
        self.answers.append(self.current)
        self.current = Answer(0)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> Answer:
        """The next complete answer (waits up to the socket's timeout for it)."""
        while not self.answers:
            data = self.sock.recv(65536)
            if not data:
                raise PeerClosed("the router closed the connection")
            self.parser.feed_data(data)
        return self.answers.popleft()

    def at_eof(self) -> bool:
        """True once the router has closed its side (reads whatever else arrives)."""
        try:
            while data := self.sock.recv(65536):
                self.parser.feed_data(data)
        except ConnectionResetError:
            return True
        return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def request(method: str, path: str, body: bytes = b"", headers: dict[str, bytes] | None = None) -> bytes:
    """A request's bytes; header values are given as bytes so that tests can send any."""
    lines = [f"{method} {path} HTTP/1.1\r\nhost: router\r\n".encode()]
    for name, value in (headers or {}).items():
        lines.append(name.encode() + b": " + value + b"\r\n")
    if body or method == "POST":
        lines.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
    return b"".join(lines) + b"\r\n" + body


def completion(max_tokens: int = 2, **fields: Any) -> bytes:
    """A completion request body (small unless ``fields`` make it big)."""
    return json.dumps({"model": "chat", "prompt": "hi", "max_tokens": max_tokens} | fields).encode()


def memory_kib(pid: int, field_name: str = "VmHWM") -> int:
    """A process's peak (VmHWM) or current (VmRSS) resident memory from /proc, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field_name} for process {pid}")
