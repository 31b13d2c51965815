"""The bounded, fire-and-forget mirror: copies of requests go to a shadow revision off the serving path.

``offer`` never blocks and never fails the caller: when the queue is full (in copies or in bytes:
bodies and stable answers held) the copy is dropped and counted. A fixed number of workers send
the copies; whatever the shadow answers goes only into a paired record. A queued copy whose shadow
the route no longer names (the rollout moved on, or rolled back) is dropped unsent and counted as
stale: a backlog left from the shadow stage must not load the candidate while the next stage
measures it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from revgate.shadow.records import PairedRecord, prompt_text


@dataclass(frozen=True, slots=True)
class MirrorJob:
    """One request to mirror, with what the caller already received from its pinned revision."""

    request_id: str
    route: str
    generation: int
    path: str
    body: bytes
    target: Any  # the router's shadow target; opaque here
    stable_revision: str
    shadow_revision: str
    stable_status: int
    stable_output: str | None
    stable_ttft_s: float | None
    stable_e2e_s: float | None
    tenant: str = ""
    caller_request_id: str = ""

    @property
    def size(self) -> int:
        """The bytes this copy holds while queued: the request body and the stable answer's text."""
        return len(self.body) + (len(self.stable_output) if self.stable_output else 0)


@dataclass(frozen=True, slots=True)
class ShadowAnswer:
    """What the shadow revision returned (never shown to the caller)."""

    status: int | None
    output: str | None
    ttft_s: float | None
    e2e_s: float | None
    error: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None


@dataclass
class MirrorCounters:
    """Offered, dropped (queue full), stale (the route stopped shadowing), sent and failed copies."""

    offered: int = 0
    dropped: int = 0
    stale: int = 0
    sent: int = 0
    failed: int = 0


Send = Callable[[MirrorJob], Awaitable[ShadowAnswer]]
Write = Callable[[PairedRecord], None]
Wanted = Callable[[MirrorJob], bool]


def always(job: MirrorJob) -> bool:
    """Every queued copy is still wanted (no route to consult)."""
    return True


def pair(job: MirrorJob, answer: ShadowAnswer) -> PairedRecord:
    """The paired record for a mirrored request."""
    return PairedRecord(
        request_id=job.request_id,
        route=job.route,
        generation=job.generation,
        path=job.path,
        stable_revision=job.stable_revision,
        shadow_revision=job.shadow_revision,
        stable_status=job.stable_status,
        stable_output=job.stable_output,
        stable_ttft_s=job.stable_ttft_s,
        stable_e2e_s=job.stable_e2e_s,
        shadow_status=answer.status,
        shadow_output=answer.output,
        shadow_ttft_s=answer.ttft_s,
        shadow_e2e_s=answer.e2e_s,
        shadow_error=answer.error,
        tenant=job.tenant,
        shadow_prompt_tokens=answer.prompt_tokens,
        shadow_output_tokens=answer.output_tokens,
        caller_request_id=job.caller_request_id,
        prompt=prompt_text(job.body),
    )


class ShadowMirror:
    """A queue bounded in copies and in bytes, drained by ``concurrency`` workers."""

    def __init__(self, send: Send, write: Write, *, capacity: int = 256, capacity_bytes: int = 64 * 1024 * 1024,
                 concurrency: int = 4, wanted: Wanted = always) -> None:
        self._send, self._write, self._wanted = send, write, wanted
        self._queue: asyncio.Queue[MirrorJob] = asyncio.Queue(maxsize=capacity)
        self.capacity_bytes = capacity_bytes
        self.held_bytes = 0  # queued and in-flight copies
        self._concurrency = concurrency
        self._workers: list[asyncio.Task[None]] = []
        self.counters = MirrorCounters()

    def start(self) -> None:
        """Start the workers on the running loop."""
        self._workers = [asyncio.create_task(self._work()) for _ in range(self._concurrency)]

    def offer(self, job: MirrorJob) -> bool:
        """Queue a copy; False (and counted as dropped) when the queue is full."""
        self.counters.offered += 1
        size = job.size
        if self.held_bytes + size > self.capacity_bytes:
            self.counters.dropped += 1
            return False
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.counters.dropped += 1
            return False
        self.held_bytes += size
        return True

    async def drain(self) -> None:
        """Wait until every queued copy has been sent (used at shutdown and in tests)."""
        await self._queue.join()

    async def stop(self) -> None:
        """Cancel the workers; queued copies are abandoned."""
        for worker in self._workers:
            worker.cancel()
        for worker in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            if not self._wanted(job):
                self.held_bytes -= job.size
                self._queue.task_done()
                self.counters.stale += 1
                continue
            try:
                answer = await self._send(job)
            except Exception as error:  # a shadow failure must never reach serving
                answer = ShadowAnswer(None, None, None, None, error=f"{type(error).__name__}: {error}")
            finally:
                self.held_bytes -= job.size
                self._queue.task_done()
            self.counters.sent += 1
            if answer.error:
                self.counters.failed += 1
            self._write(pair(job, answer))
