"""The request-record sink: the router's records as one object per flush interval in a record store.

Requests append to an in-memory buffer (constant time); a timer task serialises the buffer and
writes it as one object through :mod:`registry.record_store` (a folder, or an S3 prefix that every
router of a route shares). A store that cannot be written never slows or stops serving: the batch
that failed is kept under its name and retried (so a write that did land is not duplicated), new
records wait in a buffer bounded in records, and when that is full the oldest record is dropped
and counted. Failures, drops and what is held show in ``/metrics``, ``/admin/health`` and the log.

With a signer (``revgate router --records-key``, made by ``revgate router-key``) every object ends
in a signature line over its full name and its bytes (the format is in :mod:`registry.record_signing`),
so a reader holding the router's public key can tell this router's objects from anyone else's. The
object is signed once, when its batch is made, and retried as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from typing import Any, Protocol

from revgate.registry.record_signing import RecordSigner
from revgate.registry.record_store import ObjectName, RecordStore, RecordStoreUnavailable
from revgate.serving.router.records import batch_lines

log = logging.getLogger("revgate.router.sink")

LOG_EVERY_S = 30.0  # a failing store is logged when it starts failing, then at most this often
CLOSE_S = 5.0  # the last write at shutdown waits this long for a failing store


class Sink(Protocol):
    """Where the router's records go: append now, write later."""

    def append(self, record: Any) -> None:
        """Queue one record (constant time)."""
        ...

    def start(self) -> None:
        """Start writing on the running loop."""
        ...

    async def close(self) -> None:
        """Write what is left and stop."""
        ...


class Tee:
    """Two sinks fed the same records (a local file and the record store)."""

    def __init__(self, first: Sink, second: Sink) -> None:
        self.first, self.second = first, second

    def append(self, record: Any) -> None:
        self.first.append(record)
        self.second.append(record)

    def start(self) -> None:
        self.first.start()
        self.second.start()

    async def close(self) -> None:
        await self.first.close()
        await self.second.close()


class ObjectSink:
    """Batches records into one object per interval: ``<route>/<kind>/<router>/<ms>-<boot>-<seq>-<dropped>.jsonl``."""

    def __init__(self, store: RecordStore, route: str, kind: str, router: str, *, interval_s: float = 1.0,
                 capacity: int = 100_000, signer: RecordSigner | None = None) -> None:
        self.store, self.route, self.kind, self.router = store, route, kind, router
        self.signer = signer
        self.interval_s, self.capacity = interval_s, capacity
        self.boot = secrets.token_hex(4)  # this process's objects, told apart from a restarted router's
        self.buffer: deque[Any] = deque()
        self.pending: tuple[ObjectName, bytes, int] | None = None  # the batch that failed, retried as is
        self.sequence = 0
        self.written_records = self.written_objects = 0
        self.failures = self.dropped = 0
        self.last_error = ""
        self.last_success_s: float | None = None
        self.failing_since_s: float | None = None
        self._logged_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def append(self, record: Any) -> None:
        """Queue one record; over capacity the oldest queued record is dropped and counted."""
        buffer = self.buffer
        if len(buffer) >= self.capacity:
            buffer.popleft()
            self.dropped += 1
        buffer.append(record)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        """Stop the timer and make one last attempt to write what is held."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_S):
                await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.flush()
            except Exception as error:  # the flush task must outlive any store failure
                self._failed(f"{type(error).__name__}: {error}")

    async def flush(self) -> bool:
        """Write the failed batch, if any, then what was queued when the flush began; False when the store refused.

        Records that arrive while an object is being written wait for the next interval: drained in
        a loop instead, a busy router wrote an object every few milliseconds (each a new file, or an
        S3 request), not one a second, and the writes cost more than the requests they recorded.
        """
        if self.pending is not None and not await self._put():
            return False
        if not self.buffer:
            return True
        self.pending = self._batch()
        return await self._put()

    async def _put(self) -> bool:
        """Write the pending batch; on failure it stays pending, retried as it is."""
        assert self.pending is not None
        name, data, count = self.pending
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.store.put, name.key, data)
        except RecordStoreUnavailable as error:
            self._failed(str(error))
            return False
        self.pending = None
        self._succeeded(count)
        return True

    def _batch(self) -> tuple[ObjectName, bytes, int]:
        """Everything queued, serialised under the next name (serialisation happens here, off the request path)."""
        batch, self.buffer = self.buffer, deque()
        body, count = batch_lines(batch, self._unwritable)
        name = ObjectName(self.route, self.kind, self.router, int(time.time() * 1000), self.boot, self.sequence,
                          self.dropped)
        self.sequence += 1
        return name, body if self.signer is None else self.signer.sign(name.key, body), count

    def _unwritable(self, error: Exception) -> None:
        """A record that cannot be written is dropped, counted."""
        self.dropped += 1
        log.error("%s records: dropped one that cannot be serialised: %s", self.kind, error)

    def _failed(self, error: str) -> None:
        self.failures += 1
        self.last_error = error
        now = time.time()
        if self.failing_since_s is None:
            self.failing_since_s = now
        if now - self._logged_s >= LOG_EVERY_S:
            self._logged_s = now
            log.warning("%s records: cannot write (%d failures, %d held, %d dropped so far): %s",
                        self.kind, self.failures, self.held, self.dropped, error)

    def _succeeded(self, count: int) -> None:
        self.written_records += count
        self.written_objects += 1
        self.last_success_s = time.time()
        if self.failing_since_s is not None:
            log.info("%s records: writing again after %.1f s of failures (%d dropped)", self.kind,
                     self.last_success_s - self.failing_since_s, self.dropped)
            self.failing_since_s = None
            self._logged_s = 0.0

    @property
    def held(self) -> int:
        """Records in memory, not yet written: the failed batch and the queue."""
        return len(self.buffer) + (self.pending[2] if self.pending else 0)

    @property
    def ok(self) -> bool:
        """Whether the last write succeeded (or none was needed yet)."""
        return self.failing_since_s is None

    def health(self) -> dict[str, Any]:
        """The sink's state for ``/admin/health``."""
        return {
            "ok": self.ok, "where": self.store.where(f"{self.route}/{self.kind}/{self.router}/"),
            "signed": self.signer is not None,
            "written_records": self.written_records, "written_objects": self.written_objects,
            "failures": self.failures, "dropped": self.dropped, "held": self.held, "capacity": self.capacity,
            "last_error": self.last_error, "last_success_s": self.last_success_s,
            "failing_since_s": self.failing_since_s,
        }
