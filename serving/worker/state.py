"""Replica lifecycle (seed algorithm 32.1): states, allowed transitions as data, and the replica record.

Pure: no I/O. The agent holds one :class:`Replica` value per replica and replaces it on every
change, so a reader (the control API, the capacity report) always sees a consistent snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from revgate.manifests.errors import RevgateError


class ReplicaState(StrEnum):
    """Where a replica is in its life; only ``ready`` counts as capacity or takes traffic."""

    CREATED = "created"
    LOADING = "loading"
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"
    TERMINATED = "terminated"
    FAILED = "failed"


S = ReplicaState

# Failure can strike in every live state; draining may be asked for before readiness too (a start
# cancelled while loading still stops its process through the drain path). Terminal states end it.
TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    S.CREATED: frozenset({S.LOADING, S.FAILED, S.TERMINATED}),
    S.LOADING: frozenset({S.WARMING, S.DRAINING, S.FAILED}),
    S.WARMING: frozenset({S.READY, S.DRAINING, S.FAILED}),
    S.READY: frozenset({S.DRAINING, S.FAILED}),
    S.DRAINING: frozenset({S.TERMINATED, S.FAILED}),
    S.TERMINATED: frozenset(),
    S.FAILED: frozenset(),
}

TERMINAL = frozenset(state for state, targets in TRANSITIONS.items() if not targets)
# A process exists (or may) in these states, so supervision watches them.
SUPERVISED = frozenset({S.LOADING, S.WARMING, S.READY, S.DRAINING})


class IllegalTransition(RevgateError):
    """A lifecycle change the state machine does not allow was asked for; nothing changed."""


def check_transition(current: ReplicaState, target: ReplicaState, replica_id: str = "") -> None:
    """Raise :class:`IllegalTransition` unless ``current -> target`` is allowed."""
    if target not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "none (terminal state)"
        raise IllegalTransition(
            f"replica cannot go from {current} to {target}",
            where=f"replica {replica_id}" if replica_id else "",
            fix=f"Allowed next states: {allowed}.",
        )


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a replica failed: the error type, its explanation, and for a dead process its exit and log tail."""

    error: str
    message: str
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Capacity:
    """What warm-up measured: sustained completions per second and output tokens per second."""

    requests_per_s: float
    output_tokens_per_s: float
    concurrency: int


@dataclass(frozen=True, slots=True)
class DrainReport:
    """How a drain ended: requests that finished within the grace period, and those cancelled."""

    grace_s: float
    completed: int
    cancelled: int
    cancel_reason: str
    port_released: bool
    memory_released: bool  # the engine process is gone, so the memory it held is free
    process_exit_code: int | None
    killed: bool = False  # the engine ignored SIGTERM for the stop timeout and was killed
    stop_reason: str = ""  # how the engine ended when it did not simply exit on SIGTERM


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica of one service revision on this host; replaced, never mutated."""

    replica_id: str
    revision: str  # the service revision fingerprint, sha256:<hex>
    served_model: str
    state: ReplicaState = ReplicaState.CREATED
    endpoint: str = ""  # the worker's local proxy for this replica: where traffic goes
    created_at: float = 0.0  # wall-clock seconds at its start request (a reaper's grace counts from here)
    engine_port: int | None = None
    pid: int | None = None
    cpu_cores: tuple[int, ...] = ()  # on the CPU: the cores its engine computes on
    timings_s: dict[str, float] = field(default_factory=dict)
    capacity: Capacity | None = None
    failure: Failure | None = None
    drain: DrainReport | None = None
    adopted: bool = False  # taken over, running, from an earlier agent on this host's cache

    def moved_to(self, target: ReplicaState, **changes: object) -> Replica:
        """A copy in ``target`` state with ``changes`` applied; refuses disallowed transitions."""
        check_transition(self.state, target, self.replica_id)
        return replace(self, state=target, **changes)  # type: ignore[arg-type]

    def failed(self, failure: Failure) -> Replica:
        """A copy in ``failed`` state with its reason."""
        return self.moved_to(ReplicaState.FAILED, failure=failure)

    @property
    def is_ready(self) -> bool:
        """Readiness: published only after warm-up passed, withdrawn first thing on drain."""
        return self.state is ReplicaState.READY
