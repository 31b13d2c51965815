"""The client for a worker agent's control API, through the seam (not on the request path): every answer typed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from revgate.manifests.errors import RevgateError
from revgate.manifests.revision import RuntimeEnvironment
from revgate.manifests.seam import Refused, Reply, Seam, Transport, network
from revgate.registry.compat import EngineCapabilities
from revgate.serving.worker.request import ReplicaRequest
from revgate.serving.worker.views import ENDED, CapacityReport, ReplicaList, ReplicaView


class WorkerRequestFailed(Refused):
    """The worker answered a control request with an error."""


class WorkerUnauthorized(WorkerRequestFailed):
    """The worker refused the token (401)."""


class ReplicaWaitTimeout(RevgateError):
    """A replica did not reach the awaited state in time."""


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


def _refused(status: int) -> type[Refused]:
    return WorkerUnauthorized if status == 401 else WorkerRequestFailed


class WorkerClient:
    """Talks to one worker agent at ``url`` with its bearer token, through the seam: every answer typed."""

    def __init__(self, url: str, token: str, timeout_s: float = 30.0, transport: Transport = network) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.seam = Seam(self.url, service="worker agent", token=token, timeout_s=timeout_s, transport=transport,
                         refused=_refused)

    def call(self, method: str, path: str, reply: type[Reply], body: dict[str, Any] | bytes | None = None) -> Reply:
        """One control request; its answer as ``reply``, or a typed error naming the worker's reason."""
        return self.seam.call(method, path, reply, body)

    def _view(self, view: ReplicaView) -> ReplicaView:
        return view.model_copy(update={"worker_url": self.url})

    def start(self, request: ReplicaRequest) -> ReplicaView:
        """Ask for a new replica; returns it in state ``created``."""
        return self._view(self.call("POST", "/v1/replicas", ReplicaView, request.canonical()))

    def replicas(self) -> list[ReplicaView]:
        """Every replica the worker has had."""
        return [self._view(view) for view in self.call("GET", "/v1/replicas", ReplicaList).replicas]

    def replica(self, replica_id: str) -> ReplicaView:
        """One replica's current view."""
        return self._view(self.call("GET", f"/v1/replicas/{replica_id}", ReplicaView))

    def drain(self, replica_id: str, grace_s: float) -> ReplicaView:
        """Begin draining (returns at once; wait for ``terminated``)."""
        return self._view(self.call("POST", f"/v1/replicas/{replica_id}/drain", ReplicaView, {"grace_s": grace_s}))

    def stop(self, replica_id: str) -> ReplicaView:
        """Drain with no grace period."""
        return self._view(self.call("POST", f"/v1/replicas/{replica_id}/stop", ReplicaView, b""))

    def capacity(self) -> CapacityReport:
        """Ready capacity per revision, and the host's free slots."""
        return self.call("GET", "/v1/capacity", CapacityReport)

    def engine(self) -> AgentEngine:
        """The agent's engine build and what it can run."""
        return AgentEngine.from_report(self.call("GET", "/v1/engine", dict[str, Any]), url=self.url)

    def wait_for(self, replica_id: str, states: set[str], timeout_s: float, every_s: float = 0.2) -> ReplicaView:
        """Poll until the replica is in one of ``states`` (or a terminal state); return its view."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.replica(replica_id)
            if view.state in states or view.state in ENDED:
                return view
            if time.monotonic() > deadline:
                raise ReplicaWaitTimeout(
                    f"replica {replica_id} is still {view.state} after {timeout_s:.0f} s",
                    where=self.url,
                    fix="Read the replica's engine log in the worker's cache (logs/).",
                )
            time.sleep(every_s)
