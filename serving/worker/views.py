"""What a worker agent answers its controller with, as documents: parsed at the seam, read as fields.

serving.worker.report builds these answers on the agent; serving.worker.client parses them with
:mod:`revgate.manifests.seam`. A controller reads ``view.state``, never ``view["state"]``: a
field missing or of the wrong type fails where the answer arrives, naming the agent and the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from revgate.manifests.seam import ReplyDocument

State = Literal["created", "loading", "warming", "ready", "draining", "terminated", "failed"]
LIVE: frozenset[str] = frozenset({"created", "loading", "warming", "ready"})  # may take or soon take traffic
ENDED: frozenset[str] = frozenset({"failed", "terminated"})


class FailureView(ReplyDocument):
    """Why a replica failed."""

    error: str
    message: str
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()


class CapacityView(ReplyDocument):
    """What a replica's warm-up measured."""

    requests_per_s: float
    output_tokens_per_s: float
    concurrency: int


class DrainView(ReplyDocument):
    """How a drain ended: requests that finished within the grace period, and those cancelled."""

    grace_s: float
    completed: int
    cancelled: int
    cancel_reason: str
    port_released: bool
    memory_released: bool
    process_exit_code: int | None = None
    killed: bool = False
    stop_reason: str = ""


class ReplicaView(ReplyDocument):
    """One replica as its agent reports it; ``worker_url`` is the agent it was asked of (set by the client)."""

    replica_id: str
    revision: str
    served_model: str
    state: State
    endpoint: str = ""
    ready: bool = False
    in_flight: int = 0
    created_at: float = 0.0
    engine_port: int | None = None
    pid: int | None = None
    cpu_cores: tuple[int, ...] = ()
    timings_s: dict[str, float] = Field(default_factory=dict)
    capacity: CapacityView | None = None
    failure: FailureView | None = None
    drain: DrainView | None = None
    probes: dict[str, bool] = Field(default_factory=dict)
    adopted: bool = False
    worker_url: str = ""

    @property
    def live(self) -> bool:
        """Created, loading, warming or ready: it holds, or will hold, a slot and maybe traffic."""
        return self.state in LIVE

    @property
    def reason(self) -> str:
        """The failure's error and message, or nothing."""
        return "" if self.failure is None else f"{self.failure.error} {self.failure.message}".strip()


class ReplicaList(ReplyDocument):
    """``GET /v1/replicas``."""

    replicas: tuple[ReplicaView, ...]


class RevisionCapacity(ReplyDocument):
    """One revision's entry in the capacity report: ready replicas and what they measured, by endpoint."""

    ready_replicas: int
    requests_per_s: float
    output_tokens_per_s: float
    ready_endpoints: dict[str, float] = Field(default_factory=dict)
    # Replica ids by state: listed so a controller sees capacity on its way, never counted as capacity.
    created: tuple[str, ...] = ()
    loading: tuple[str, ...] = ()
    warming: tuple[str, ...] = ()
    ready: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()


class CapacityReport(ReplyDocument):
    """``GET /v1/capacity``: ready capacity per revision, and the host's room for more replicas."""

    revisions: dict[str, RevisionCapacity]
    device: str = "cpu"
    slots: int = 0
    free_slots: int = 0
