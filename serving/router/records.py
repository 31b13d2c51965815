"""JSON-lines writers that batch off the request path: requests append, a timer flushes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Protocol

try:  # orjson serialises dataclasses natively, three times faster than the standard library here
    import orjson
except ImportError:  # pragma: no cover - the standard library path below gives identical lines
    orjson = None  # type: ignore[assignment]


log = logging.getLogger("revgate.router.records")
LOG_EVERY_S = 30.0  # a failing file is logged when it starts failing, then at most this often


class JsonLine(Protocol):
    """Anything that serialises itself as one JSON line."""

    def to_json(self) -> str:
        """One line, no newline."""
        ...


def dataclass_line(record: Any) -> str:
    """The same JSON line as ``dataclasses.asdict`` + ``json.dumps``, without asdict's deep copies.

    Records hold only JSON scalars and flat string dicts, so a shallow dict is enough; asdict
    deep-copies every field and costs more than the rest of the request's bookkeeping together.
    """
    if orjson is not None:
        return orjson.dumps(record).decode()
    names = _FIELD_NAMES.get(type(record))
    if names is None:
        names = _FIELD_NAMES[type(record)] = tuple(field.name for field in dataclasses.fields(record))
    return json.dumps({name: getattr(record, name) for name in names}, separators=(",", ":"), ensure_ascii=False)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def line_bytes(record: Any) -> bytes:
    """``dataclass_line`` plus the newline, as UTF-8 (orjson writes it so directly).

    A record may also be given as its JSON object already (a dict with the dataclass's fields in
    order): the same line.
    """
    if orjson is not None:
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    if isinstance(record, dict):
        return (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    return (dataclass_line(record) + "\n").encode()


def batch_lines(batch: Iterable[Any], unwritable: Callable[[Exception], None]) -> tuple[bytes, int]:
    """A batch of records as JSON lines in one buffer, and how many lines it holds.

    Each line goes into the buffer as soon as it is made: a batch of lines kept alive until one
    join allocates thousands of fresh blocks, and cost several times the serialisation itself on
    the router bench. A record that cannot be serialised is left out and given to ``unwritable``.
    """
    out, count = bytearray(), 0
    for record in batch:
        try:
            out += line_bytes(record)
        except (TypeError, ValueError) as error:
            unwritable(error)
            continue
        count += 1
    return bytes(out), count


class JsonLinesWriter:
    """Appends records to a file in batches; with no path it discards them.

    A file that cannot be written (a full disk, a lost mount) never stops the writer or the
    router: the batch that failed is taken back (the bytes of a half-written batch are cut off
    again where the file allows it), new records wait in a buffer bounded by ``capacity``, the
    oldest dropped and counted past it, and the state shows in ``health()``, the router's metrics
    and its log until writes succeed again.
    """

    def __init__(self, path: Path | None, *, interval_s: float = 0.2, capacity: int = 100_000,
                 kind: str = "records") -> None:
        self.path, self.interval_s, self.capacity, self.kind = path, interval_s, capacity, kind
        self.buffer: list[JsonLine | dict[str, Any]] = []
        self.written = self.failures = self.dropped = 0
        self.last_error = ""
        self.failing_since_s: float | None = None
        self._logged_s = 0.0
        self._stream: IO[bytes] | None = None
        self._task: asyncio.Task[None] | None = None

    def append(self, record: JsonLine | dict[str, Any]) -> None:
        """Queue one record (constant time; serialisation happens at flush); over capacity the oldest go."""
        if self.path is not None:
            self.buffer.append(record)
            if len(self.buffer) > self.capacity:
                self._bound()

    def start(self) -> None:
        """Open the file and start the flush timer on the running loop."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stream = self.path.open("ab", buffering=0)
        self._task = asyncio.create_task(self._run())

    def flush(self) -> None:
        """Write everything queued so far; a failed write keeps the batch for the next flush."""
        if not self.buffer or self._stream is None:
            return
        batch, self.buffer = self.buffer, []
        data, _ = batch_lines(batch, self._unwritable)
        try:
            self._write_all(data)
        except OSError as error:
            self.buffer = batch + self.buffer
            self._bound()
            self._failed(f"{type(error).__name__}: {error}")
            return
        self.written += len(batch)
        self._succeeded()

    def _bound(self) -> None:
        """Hold the buffer to ``capacity`` (the oldest records go, counted)."""
        excess = len(self.buffer) - self.capacity
        if excess > 0:
            del self.buffer[:excess]
            self.dropped += excess

    def _unwritable(self, error: Exception) -> None:
        """A record that cannot be written is dropped, counted."""
        self.dropped += 1
        log.error("%s file: dropped a record that cannot be serialised: %s", self.kind, error)

    def _write_all(self, data: bytes) -> None:
        """Append ``data`` whole, or cut the file back to where it was and raise."""
        stream = self._stream
        assert stream is not None
        start = stream.seek(0, io.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                written = stream.write(view)
                view = view[written or 0:]
        except OSError:
            with contextlib.suppress(OSError):
                stream.truncate(start)  # no half line for readers; a device such as /dev/full cannot
            raise

    def _failed(self, error: str) -> None:
        self.failures += 1
        self.last_error = error
        now = time.time()
        if self.failing_since_s is None:
            self.failing_since_s = now
        if now - self._logged_s >= LOG_EVERY_S:
            self._logged_s = now
            log.warning("%s file %s: cannot write (%d failures, %d held, %d dropped so far): %s",
                        self.kind, self.path, self.failures, len(self.buffer), self.dropped, error)

    def _succeeded(self) -> None:
        if self.failing_since_s is not None:
            log.info("%s file %s: writing again after %.1f s of failures (%d dropped)", self.kind, self.path,
                     time.time() - self.failing_since_s, self.dropped)
            self.failing_since_s = None
            self._logged_s = 0.0

    @property
    def ok(self) -> bool:
        """Whether the last write succeeded (or none was needed yet)."""
        return self.failing_since_s is None

    def health(self) -> dict[str, Any]:
        """The file's state for ``/admin/health``."""
        return {"ok": self.ok, "where": str(self.path), "written_records": self.written, "failures": self.failures,
                "dropped": self.dropped, "held": len(self.buffer), "capacity": self.capacity,
                "last_error": self.last_error, "failing_since_s": self.failing_since_s}

    async def close(self) -> None:
        """Stop the timer, write what is left, close the file."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.flush()
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.flush()
            except Exception as error:  # the flush task must outlive any failure
                self._failed(f"{type(error).__name__}: {error}")
