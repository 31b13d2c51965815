"""The thin local proxy in front of one vLLM replica: admission, in-flight counting, revision header.

Raw asyncio streams, no framework: it parses only the request head and Content-Length, relays
the upstream response bytes as they come (SSE streams included) and adds the headers that name
the revision and replica. One request per client connection (``Connection: close``): this keeps
the relay free of response framing, and the router in front pools nothing through it.

Only the OpenAI inference paths a router sends (and ``/health``) are relayed. Everything else
vLLM offers (``/v1/load_lora_adapter`` puts weights nobody verified into a verified replica,
``/tokenize``, ``/metrics``, ...) is answered 404 here and never reaches the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Coroutine
from typing import Any

from revgate.serving.worker.drain import Admission, Refusal

REVISION_HEADER = "x-revgate-revision"
REPLICA_HEADER = "x-revgate-replica"
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 4 * 1024 * 1024  # as the router's --max-body-bytes: nothing larger reaches a replica through it
# The router's defaults (serving/router/limits.py): a caller that holds a connection without
# finishing its request, or without reading its answer, is cut off, never served for ever.
HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0
WRITE_STALL_TIMEOUT_S = 30.0
LINGER_S = 2.0
LINGER_BYTES = 1024 * 1024
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "upgrade"}
# Method and exact path (query string aside): what the router, the promotion checks and an operator's
# liveness probe use. An exact match leaves no room for ``..``, percent-escapes or absolute URLs.
EXPOSED = frozenset({
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
})


class BadRequest(Exception):
    """The client's request head or body cannot be relayed."""


class TooSlow(Exception):
    """The client did not finish its request head or body in time (answered 408)."""


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    request_line, header_lines = lines[0], [line for line in lines[1:] if line]
    if len(request_line.split(" ")) != 3:
        raise BadRequest(f"malformed request line {request_line[:80]!r}")
    headers = []
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(f"malformed header line {line[:80]!r}")
        headers.append((name.strip(), value.strip()))
    return request_line, headers


def not_exposed(head: bytes) -> str | None:
    """Why the request may not pass (a method and path outside :data:`EXPOSED`), or None."""
    request_line, _ = _parse_head(head)
    method, target, _ = request_line.split(" ")
    path = target.partition("?")[0]
    if (method, path) in EXPOSED:
        return None
    exposed = ", ".join(f"{m} {p}" for m, p in sorted(EXPOSED, key=lambda pair: pair[1]))
    return f"{method} {path[:200]} is not exposed by the replica proxy; it serves only {exposed}"


def upstream_request(head: bytes, body: bytes) -> tuple[bytes, int]:
    """The request to send upstream (hop-by-hop headers replaced by ``Connection: close``) and its body size."""
    request_line, headers = _parse_head(head)
    lengths = [value for name, value in headers if name.lower() == "content-length"]
    if any(name.lower() == "transfer-encoding" for name, _ in headers):
        raise BadRequest("chunked request bodies are not supported; send Content-Length")
    kept = [f"{name}: {value}" for name, value in headers if name.lower() not in HOP_BY_HOP]
    text = "\r\n".join([request_line, *kept, "Connection: close", "", ""])
    return text.encode("latin-1") + body, int(lengths[0]) if lengths else 0


def tagged_response_head(head: bytes, revision: str, replica_id: str) -> bytes:
    """The upstream response head with the revision and replica headers added and ``Connection: close``."""
    lines = head.decode("latin-1").split("\r\n")
    kept = [line for line in lines[1:] if line and line.partition(":")[0].strip().lower() not in HOP_BY_HOP]
    extra = [f"{REVISION_HEADER}: {revision}", f"{REPLICA_HEADER}: {replica_id}", "connection: close"]
    return "\r\n".join([lines[0], *kept, *extra, "", ""]).encode("latin-1")


def error_response(status: int, phrase: str, reason: str, revision: str, retry_after_s: int | None = None) -> bytes:
    """A complete JSON error response in the OpenAI error shape, with the retry signal when given."""
    body = json.dumps({"error": {"message": reason, "type": phrase.lower().replace(" ", "_"), "code": status}})
    headers = [
        f"HTTP/1.1 {status} {phrase}",
        "content-type: application/json",
        f"content-length: {len(body.encode())}",
        f"{REVISION_HEADER}: {revision}",
        "connection: close",
    ]
    if retry_after_s is not None:
        headers.append(f"retry-after: {retry_after_s}")
    return ("\r\n".join([*headers, "", ""]) + body).encode("utf-8")


def refusal_response(refusal: Refusal, revision: str) -> bytes:
    """503 with Retry-After and the reason: the caller should go to another replica or retry later."""
    return error_response(503, "Service Unavailable", refusal.reason, revision, refusal.retry_after_s)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After answering a request whose body was not read: end our side, then discard what the caller
    still sends (bounded), so closing does not reset the connection and lose the answer in flight."""
    writer.write_eof()
    discarded = 0
    async with asyncio.timeout(LINGER_S):
        while discarded < LINGER_BYTES and (chunk := await reader.read(65536)):
            discarded += len(chunk)


async def _within(read: Coroutine[Any, Any, bytes], seconds: float, what: str) -> bytes:
    """``read``, or TooSlow naming ``what`` once ``seconds`` pass."""
    try:
        async with asyncio.timeout(seconds):
            return await read
    except TimeoutError:
        raise TooSlow(f"{what} not complete within {seconds:g} s") from None


class _Exchange:
    """Progress of one relayed request: whether the caller has seen the response head yet."""

    head_sent = False


class ReplicaProxy:
    """Listens on a free local port and relays admitted requests to the replica's engine port."""

    def __init__(self, admission: Admission, revision: str, upstream_port: int, host: str = "127.0.0.1", *,
                 head_timeout_s: float = HEAD_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                 write_stall_timeout_s: float = WRITE_STALL_TIMEOUT_S) -> None:
        self.head_timeout_s, self.body_timeout_s = head_timeout_s, body_timeout_s
        self.write_stall_timeout_s = write_stall_timeout_s
        self.admission = admission
        self.revision = revision
        self.upstream_port = upstream_port
        self.host = host
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self, port: int = 0) -> int:
        """Start listening on ``port`` (0: a free one); returns it."""
        self._server = await asyncio.start_server(self._handle, self.host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        """Stop listening (requests in flight are the drain's business, not this method's)."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        unread = True  # whether the request's body may still be arriving when the answer is sent
        try:
            head = await _within(reader.readuntil(b"\r\n\r\n"), self.head_timeout_s, "request head")
            if len(head) > MAX_HEAD_BYTES:
                raise BadRequest("request head too large")
            refused = not_exposed(head)
            if refused is not None:
                writer.write(error_response(404, "Not Found", refused, self.revision))
                return
            refusal = self.admission.refusal()
            if refusal is not None:
                writer.write(refusal_response(refusal, self.revision))
                return
            unread = False
            await self._admitted(head, reader, writer)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass  # a drain cancelled this request; the caller already has the reason (or a cut stream)
        except TooSlow as error:
            unread = True
            writer.write(error_response(408, "Request Timeout", str(error), self.revision))
        except BadRequest as error:
            writer.write(error_response(400, "Bad Request", str(error), self.revision))
        finally:
            with contextlib.suppress(Exception):
                await self._drain(writer)
                if unread:
                    await _linger(reader, writer)
            writer.close()

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait for the caller to take what was written; one that reads nothing for the stall timeout is cut off."""
        try:
            async with asyncio.timeout(self.write_stall_timeout_s):
                await writer.drain()
        except TimeoutError:
            writer.transport.abort()
            raise ConnectionResetError("the caller read nothing within the write-stall timeout") from None

    async def _admitted(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.admission.enter(task)
        exchange = _Exchange()
        try:
            request, length = upstream_request(head, b"")
            if length > MAX_BODY_BYTES:
                raise BadRequest("request body too large")
            body = await _within(reader.readexactly(length), self.body_timeout_s, "request body")
            await self._relay(request + body, writer, exchange)
        except asyncio.CancelledError:
            # Before the first byte the caller gets the stated reason; after it, the stream just ends
            # (the drain report carries the reason).
            if not exchange.head_sent:
                reason = self.admission.cancel_reason(task) or "cancelled"
                writer.write(error_response(503, "Service Unavailable", reason, self.revision, 1))
            raise
        except OSError as error:
            if not exchange.head_sent:
                reason = f"replica engine unreachable: {error}"
                writer.write(error_response(502, "Bad Gateway", reason, self.revision))
        finally:
            self.admission.leave(task)

    async def _relay(self, request: bytes, writer: asyncio.StreamWriter, exchange: _Exchange) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            up_writer.write(request)
            await up_writer.drain()
            head = await up_reader.readuntil(b"\r\n\r\n")
            writer.write(tagged_response_head(head, self.revision, self.admission.replica_id))
            exchange.head_sent = True
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await self._drain(writer)
        finally:
            up_writer.close()
