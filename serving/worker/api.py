"""The worker's control API: a small authenticated HTTP API over the agent (raw ASGI, no framework).

Every route but ``GET /healthz`` needs ``Authorization: Bearer <token>``. A request without the
right token gets 401 before its body is read, so it changes nothing.

    POST /v1/replicas                  start a replica (body: ReplicaRequest) -> 202 + replica
                                       (409 while the artifact loads under another signature policy)
    GET  /v1/replicas                  every replica with state and endpoint
    GET  /v1/replicas/{id}             one replica
    POST /v1/replicas/{id}/drain       drain (body: {"grace_s": N}) -> 202 + replica
    POST /v1/replicas/{id}/stop        drain with no grace period -> 202 + replica
    GET  /v1/capacity                  ready capacity per revision
    GET  /v1/engine                    this host's engine build (the runtime a revision pins) and capabilities
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from revgate.manifests.errors import RevgateError
from revgate.serving.worker.agent import SignaturePolicyConflict, UnknownReplica, WorkerAgent
from revgate.serving.worker.auth import authorized
from revgate.serving.worker.report import capacity_report, replica_view
from revgate.serving.worker.request import ReplicaRequest
from revgate.serving.worker.state import IllegalTransition

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_GRACE_S = 30.0


class BadControlRequest(RevgateError):
    """A control request's body is not what its route expects."""


def _error_body(error: RevgateError) -> dict[str, Any]:
    return {"error": {"type": type(error).__name__, "message": str(error), "where": error.where, "fix": error.fix}}


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    payload = json.dumps(body).encode("utf-8")
    base = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*base, *headers]})
    await send({"type": "http.response.body", "body": payload})


async def _read_body(receive: Receive) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            raise BadControlRequest("request body too large", fix=f"Send at most {MAX_BODY_BYTES} bytes.")
        if not message.get("more_body", False):
            return bytes(body)


def _grace(body: bytes) -> float:
    try:
        data = json.loads(body) if body.strip() else {}
        grace = float(data.get("grace_s", DEFAULT_GRACE_S))
    except (ValueError, TypeError, AttributeError):
        raise BadControlRequest("drain body must be JSON like {\"grace_s\": 30}", where="body") from None
    if not 0 <= grace <= 3600:
        raise BadControlRequest(f"grace_s {grace} is outside 0..3600", where="body.grace_s")
    return grace


class ControlApp:
    """The ASGI application; holds the agent and the token."""

    def __init__(self, agent: WorkerAgent, token: str) -> None:
        self.agent = agent
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point (HTTP only; lifespan events are acknowledged)."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        method, path = scope["method"], scope["path"].rstrip("/")
        if (method, path) == ("GET", "/healthz"):
            await _send_json(send, 200, {"status": "ok"})
            return
        headers = dict(scope["headers"])
        raw_auth = headers.get(b"authorization")
        if not authorized(raw_auth.decode("latin-1") if raw_auth is not None else None, self.token):
            await _send_json(send, 401, {"error": {"type": "Unauthorized", "message": "missing or wrong bearer token"}},
                             ((b"www-authenticate", b"Bearer"),))
            return
        try:
            status, body = await self._route(method, path, receive)
        except UnknownReplica as error:
            status, body = 404, _error_body(error)
        except (IllegalTransition, SignaturePolicyConflict) as error:
            status, body = 409, _error_body(error)
        except RevgateError as error:
            status, body = 400, _error_body(error)
        await _send_json(send, status, body)

    async def _route(self, method: str, path: str, receive: Receive) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        action = (method, *parts[:2], *(["{id}"] if len(parts) > 2 else []), *parts[3:])
        reports = {"capacity": lambda: capacity_report(self.agent.replicas(), device=self.agent.device,
                                                       slots=len(self.agent.slots)),
                   "engine": self.agent.engine_report}  # what this host has, and what it runs it with
        if method == "GET" and len(parts) == 2 and parts[0] == "v1" and parts[1] in reports:
            return 200, reports[parts[1]]()
        if action == ("GET", "v1", "replicas"):
            return 200, {"replicas": [self._view(replica.replica_id) for replica in self.agent.replicas()]}
        if action == ("POST", "v1", "replicas"):
            request = ReplicaRequest.from_json(await _read_body(receive), source="POST /v1/replicas body")
            return 202, self._view(self.agent.start(request).replica_id)
        if action == ("GET", "v1", "replicas", "{id}"):
            return 200, self._view(parts[2])
        if action in (("POST", "v1", "replicas", "{id}", "drain"), ("POST", "v1", "replicas", "{id}", "stop")):
            grace = _grace(await _read_body(receive)) if parts[3] == "drain" else 0.0
            return 202, self._view(self.agent.begin_drain(parts[2], grace).replica_id)
        return 404, {"error": {"type": "NotFound", "message": f"no control action {method} {path}"}}

    def _view(self, replica_id: str) -> dict[str, Any]:
        agent = self.agent
        return replica_view(agent.replica(replica_id), agent.in_flight(replica_id), agent.probes(replica_id))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.agent.take_over()  # what the last agent on this cache left: adopted or stopped
                self.agent.begin_turns()  # ready replicas on the CPU take turns on its cores
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.agent.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
