"""Admission and drain for one replica: count requests in flight, refuse new ones, cancel late ones.

The proxy registers each admitted request's task here. Drain withdraws admission first (new
requests get a retry signal at once), waits up to the grace period for in-flight requests to
finish, then cancels the rest with a stated reason.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is not admitted, and when to retry (seconds, for the Retry-After header)."""

    reason: str
    retry_after_s: int = RETRY_AFTER_S


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    """How many requests in flight at drain time finished, and how many were cancelled."""

    completed: int
    cancelled: int
    cancel_reason: str
    waited_s: float


class Admission:
    """Gate and in-flight set of one replica; one asyncio loop uses it."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self._refusal: Refusal | None = Refusal(f"replica {replica_id} is not ready yet")
        self._in_flight: set[asyncio.Task[object]] = set()
        self._cancel_reasons: dict[asyncio.Task[object], str] = {}
        self.completed = 0

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet finished."""
        return len(self._in_flight)

    def open(self) -> None:
        """Admit requests from now on (readiness published)."""
        self._refusal = None

    def close(self, reason: str) -> None:
        """Refuse new requests from now on with ``reason``; in-flight ones continue."""
        self._refusal = Refusal(reason)

    def refusal(self) -> Refusal | None:
        """None if a request may enter now, else why not."""
        return self._refusal

    def enter(self, task: asyncio.Task[object]) -> None:
        """Count an admitted request's task as in flight."""
        self._in_flight.add(task)

    def leave(self, task: asyncio.Task[object]) -> None:
        """The request's task is done (finished, failed or cancelled)."""
        if task in self._in_flight:
            self._in_flight.discard(task)
            if task not in self._cancel_reasons:
                self.completed += 1

    def cancel_reason(self, task: asyncio.Task[object]) -> str | None:
        """The stated reason if this request was cancelled by a drain."""
        return self._cancel_reasons.get(task)

    async def drain(self, grace_s: float, reason: str) -> DrainOutcome:
        """Refuse new requests, give in-flight ones ``grace_s`` seconds, then cancel the rest."""
        started = time.monotonic()
        self.close(reason)
        waiting = set(self._in_flight)
        completed_before = self.completed
        if waiting:
            await asyncio.wait(waiting, timeout=grace_s)
        late = [task for task in waiting if not task.done()]
        cancel_reason = f"cancelled: replica {self.replica_id} drained and its grace period of {grace_s:g} s ended"
        for task in late:
            self._cancel_reasons[task] = cancel_reason
            task.cancel(cancel_reason)
        if late:
            await asyncio.wait(late, timeout=5)
        return DrainOutcome(
            completed=self.completed - completed_before,
            cancelled=len(late),
            cancel_reason=cancel_reason if late else "",
            waited_s=time.monotonic() - started,
        )
