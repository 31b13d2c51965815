"""The one HTTP seam of the control plane: a request out, a typed reply back.

Everything revgate asks over HTTP off the router's hot path (a worker agent's control API, a
router's admin port, the judge model) goes through :class:`Seam`. A reply is parsed into a strict
document (a pydantic model, or any type pydantic can validate) before anyone reads it, so a
field of the wrong type fails at the seam, naming the service, the call and the field, and never
deep in a flow as a ``KeyError``. The network is one :data:`Transport`; tests give the seam an
:class:`MemoryTransport` and answer in process.

Standard library and pydantic only: the worker and the router import this too.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from revgate.manifests.errors import RevgateError

Reply = TypeVar("Reply")


class ReplyDocument(BaseModel):
    """Base of the documents a service answers with: frozen, and read strictly where it matters.

    Fields a newer service adds are ignored (a controller must keep working against an agent one
    release ahead); a field that is there must have its type.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")


class Refused(RevgateError):
    """The service answered with an error status; ``status`` and the service's own reason (0: refused
    after an answer that parsed, for what it said)."""

    def __init__(self, what: str, *, status: int = 0, where: str = "", fix: str = "") -> None:
        self.status = status
        super().__init__(what, where=where, fix=fix)


class ReplyInvalid(RevgateError, ValueError):
    """The service answered 2xx with a body that is not the document the call expects."""


@dataclass(frozen=True)
class Exchange:
    """One request as the transport sends it."""

    method: str
    url: str
    body: bytes | None
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Answer:
    """One answer: its status and body (an error status is an answer too, not an exception)."""

    status: int
    body: bytes


class Transport(Protocol):
    """Sends one exchange; raises OSError when the service cannot be reached."""

    def __call__(self, exchange: Exchange, timeout_s: float) -> Answer: ...


def network(exchange: Exchange, timeout_s: float) -> Answer:
    """The real transport (urllib): an error status is returned, not raised; OSError when unreachable."""
    request = urllib.request.Request(exchange.url, data=exchange.body, method=exchange.method,  # noqa: S310
                                     headers=dict(exchange.headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - operator's URL
            return Answer(int(response.status), bytes(response.read()))
    except urllib.error.HTTPError as error:
        return Answer(int(error.code), bytes(error.read()))


Handler = Callable[[Exchange], Answer | tuple[int, Any]]


@dataclass
class MemoryTransport:
    """A service in process, for tests: ``(method, path)`` -> a handler's answer; every exchange kept.

    A handler returns an :class:`Answer` or ``(status, document)`` (the document sent as JSON). A
    path with no handler answers 404, as a service that does not know it would.
    """

    handlers: dict[tuple[str, str], Handler] = field(default_factory=dict)
    exchanges: list[Exchange] = field(default_factory=list)

    def __call__(self, exchange: Exchange, timeout_s: float) -> Answer:
        self.exchanges.append(exchange)
        path = urlsplit(exchange.url).path or "/"
        handler = self.handlers.get((exchange.method, path))
        if handler is None:
            return Answer(404, json.dumps({"error": {"message": f"no route {exchange.method} {path}"}}).encode())
        answer = handler(exchange)
        if isinstance(answer, Answer):
            return answer
        status, document = answer
        return Answer(status, document if isinstance(document, bytes) else json.dumps(document).encode())


def error_detail(body: bytes) -> dict[str, str]:
    """The service's ``{"error": {...}}`` (message, type, fix), or the body's start as its message."""
    try:
        detail = json.loads(body).get("error", {})
        if isinstance(detail, dict):
            return {str(key): str(value) for key, value in detail.items()}
    except (ValueError, AttributeError):
        pass
    return {"message": body[:300].decode("utf-8", "replace")}


def parse_reply(reply: type[Reply], body: bytes, *, where: str, service: str) -> Reply:
    """``body`` as the document ``reply``; ReplyInvalid naming each bad field when it is not one."""
    try:
        return TypeAdapter(reply).validate_json(body)
    except ValidationError as error:
        fields = "; ".join(f"{'.'.join(str(part) for part in e['loc']) or 'the body'}: {e['msg']}"
                           for e in error.errors()[:5])
        raise ReplyInvalid(f"the {service}'s answer is not the document expected: {fields}", where=where,
                           fix=f"Run the same revgate version on the {service} as here.") from None


RefusedKind = Callable[[int], type[Refused]]


class Seam:
    """Calls to one service at ``base_url``, with its bearer token, each reply parsed into its document.

    ``refused`` picks the error class for an error status (a worker's 401 is its own kind, say),
    so callers catch what the service means, not HTTP.
    """

    def __init__(self, base_url: str, *, service: str, token: str | None = None, timeout_s: float = 30.0,
                 transport: Transport = network, refused: RefusedKind = lambda status: Refused) -> None:
        self.base_url = base_url.rstrip("/")
        self.service, self.token, self.timeout_s = service, token, timeout_s
        self.transport, self.refused = transport, refused

    def send(self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None) -> Answer:
        """One exchange, its answer whatever the status; OSError when the service cannot be reached."""
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        exchange = Exchange(method, self.base_url + path, data, headers)
        return self.transport(exchange, self.timeout_s if timeout_s is None else timeout_s)

    def call(self, method: str, path: str, reply: type[Reply], body: Any = None, *,
             timeout_s: float | None = None) -> Reply:
        """One call; its reply as ``reply``, or the ``refused`` error naming the service's reason."""
        answer = self.send(method, path, body, timeout_s=timeout_s)
        where = f"{method} {self.base_url}{path}"
        if answer.status >= 400:
            detail = error_detail(answer.body)
            kind = detail.get("type", "")
            raise self.refused(answer.status)(
                f"{self.service} answered {answer.status}: {kind + ': ' if kind else ''}{detail.get('message', '')}",
                status=answer.status, where=where, fix=detail.get("fix", "") or "Check the token and the request.")
        return parse_reply(reply, answer.body, where=where, service=self.service)
