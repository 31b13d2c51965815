"""A small client for a worker's control API (standard library only; not on the request path)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from revgate.manifests.errors import RevgateError
from revgate.manifests.revision import RuntimeEnvironment
from revgate.registry.compat import EngineCapabilities
from revgate.serving.worker.request import ReplicaRequest


class WorkerRequestFailed(RevgateError):
    """The worker answered a control request with an error."""


class WorkerUnauthorized(WorkerRequestFailed):
    """The worker refused the token (401)."""


class ReplicaWaitTimeout(RevgateError):
    """A replica did not reach the awaited state in time."""


def _error_detail(body: bytes) -> dict[str, str]:
    try:
        detail: dict[str, str] = json.loads(body).get("error", {})
    except (ValueError, AttributeError):
        return {"message": body[:300].decode("utf-8", "replace")}
    return detail


@dataclass(frozen=True)
class AgentEngine:
    """An agent's answer to ``GET /v1/engine``, parsed strictly: its runtime ``e`` and its capabilities."""

    url: str
    runtime: RuntimeEnvironment
    device: str
    capabilities: dict[str, Any]

    @classmethod
    def from_report(cls, report: dict[str, Any], *, url: str) -> AgentEngine:
        """The typed document of the agent at ``url``; WorkerRequestFailed naming the field when it is not one."""
        try:
            runtime = RuntimeEnvironment.model_validate(report["runtime"])
            return cls(url, runtime, str(report["device"]), dict(report["capabilities"]))
        except (KeyError, TypeError, ValidationError) as error:
            raise WorkerRequestFailed(f"the agent's engine report is malformed: {error}", where=f"GET {url}/v1/engine",
                                      fix="Run the same revgate version on the agent as on the controller.") from None

    def can_run(self) -> EngineCapabilities:
        """What this agent's engine build says it can run, as the compatibility check reads it."""
        try:
            return EngineCapabilities(head_sizes=frozenset(int(size) for size in self.capabilities["head_sizes"]),
                                      dtypes=frozenset(str(dtype) for dtype in self.capabilities["dtypes"]),
                                      quantization=frozenset(str(method) for method in
                                                             self.capabilities["quantization"]))
        except (KeyError, TypeError, ValueError) as error:
            raise WorkerRequestFailed(f"the agent's engine capabilities are malformed: {error!r}",
                                      where=f"GET {self.url}/v1/engine",
                                      fix="Run the same revgate version on the agent as on the controller.") from None


class MixedEngineBuilds(RevgateError):
    """The agents of one route run different engine builds: one revision would run as several."""


def one_build(engines: list[AgentEngine]) -> AgentEngine:
    """The one engine build ``engines`` share (the first agent's report); MixedEngineBuilds naming each if not."""
    if len({engine.runtime.digest for engine in engines}) > 1:
        described = "; ".join(f"{engine.url}: {engine.runtime.engine_distribution} {engine.runtime.engine_version} "
                              f"on {engine.device} (lock {engine.runtime.lock_digest[:19]})" for engine in engines)
        raise MixedEngineBuilds(f"the fleet's agents run different engine builds: {described}", where="workers",
                                fix="Run one engine build on every agent of the route, or name only agents that do.")
    return engines[0]


class WorkerClient:
    """Talks to one worker agent at ``url`` with its bearer token."""

    def __init__(self, url: str, token: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: dict[str, Any] | bytes | None = None) -> dict[str, Any]:
        """One control request; the decoded JSON answer, or a typed error naming the worker's reason."""
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as error:
            detail = _error_detail(error.read())
            kind = WorkerUnauthorized if error.code == 401 else WorkerRequestFailed
            raise kind(
                f"worker answered {error.code}: {detail.get('type', '')}: {detail.get('message', '')}",
                where=f"{method} {self.url}{path}",
                fix=detail.get("fix", "") or "Check the token and the request.",
            ) from None

    def start(self, request: ReplicaRequest) -> dict[str, Any]:
        """Ask for a new replica; returns it in state ``created``."""
        return self.call("POST", "/v1/replicas", request.canonical())

    def replicas(self) -> list[dict[str, Any]]:
        """Every replica the worker has had."""
        replicas: list[dict[str, Any]] = self.call("GET", "/v1/replicas")["replicas"]
        return replicas

    def replica(self, replica_id: str) -> dict[str, Any]:
        """One replica's current view."""
        return self.call("GET", f"/v1/replicas/{replica_id}")

    def drain(self, replica_id: str, grace_s: float) -> dict[str, Any]:
        """Begin draining (returns at once; wait for ``terminated``)."""
        return self.call("POST", f"/v1/replicas/{replica_id}/drain", {"grace_s": grace_s})

    def stop(self, replica_id: str) -> dict[str, Any]:
        """Drain with no grace period."""
        return self.call("POST", f"/v1/replicas/{replica_id}/stop", b"")

    def capacity(self) -> dict[str, Any]:
        """Ready capacity per revision."""
        return self.call("GET", "/v1/capacity")

    def engine(self) -> AgentEngine:
        """The agent's engine build and what it can run."""
        return AgentEngine.from_report(self.call("GET", "/v1/engine"), url=self.url)

    def wait_for(self, replica_id: str, states: set[str], timeout_s: float, every_s: float = 0.2) -> dict[str, Any]:
        """Poll until the replica is in one of ``states`` (or a terminal state); return its view."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.replica(replica_id)
            if view["state"] in states or view["state"] in ("failed", "terminated"):
                return view
            if time.monotonic() > deadline:
                raise ReplicaWaitTimeout(
                    f"replica {replica_id} is still {view['state']} after {timeout_s:.0f} s",
                    where=self.url,
                    fix="Read the replica's engine log in the worker's cache (logs/).",
                )
            time.sleep(every_s)
