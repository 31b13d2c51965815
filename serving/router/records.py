"""JSON-lines writers that batch off the request path: requests append, a timer flushes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import IO, Any, Protocol

try:  # orjson serialises dataclasses natively, three times faster than the standard library here
    import orjson
except ImportError:  # pragma: no cover - the standard library path below gives identical lines
    orjson = None  # type: ignore[assignment]


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


class JsonLinesWriter:
    """Appends records to a file in batches; with no path it discards them."""

    def __init__(self, path: Path | None, *, interval_s: float = 0.2) -> None:
        self.path, self.interval_s = path, interval_s
        self.buffer: list[JsonLine | dict[str, Any]] = []
        self.written = 0
        self._stream: IO[bytes] | None = None
        self._task: asyncio.Task[None] | None = None

    def append(self, record: JsonLine | dict[str, Any]) -> None:
        """Queue one record (constant time; serialisation happens at flush)."""
        if self.path is not None:
            self.buffer.append(record)

    def start(self) -> None:
        """Open the file and start the flush timer on the running loop."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stream = self.path.open("ab")
        self._task = asyncio.create_task(self._run())

    def flush(self) -> None:
        """Write everything queued so far."""
        if not self.buffer or self._stream is None:
            return
        batch, self.buffer = self.buffer, []
        self._stream.write(b"".join([line_bytes(record) for record in batch]))
        self._stream.flush()
        self.written += len(batch)

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
            self.flush()
