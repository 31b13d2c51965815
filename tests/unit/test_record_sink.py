"""The request-record sink and its reader over a folder: objects per flush, bounded memory, incremental reads."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from revgate.evaluation.records import RequestRecord
from revgate.registry.record_store import (
    FolderRecordStore,
    RecordReader,
    RecordStoreInvalid,
    StageWindow,
    check_router_id,
    open_record_store,
)
from revgate.serving.router.parse import parse_body
from revgate.serving.router.service import _declared
from revgate.serving.router.sink import ObjectSink


def record(number: int, generation: int = 1, arrival_s: float = 1000.0) -> dict[str, Any]:
    return {"request_id": f"r{number}", "revision": "sha256:" + "a" * 64, "arm": "stable", "arrival_s": arrival_s,
            "outcome": "ok", "generation": generation, "route": "chat"}


def reader(store: FolderRecordStore, **kwargs: Any) -> RecordReader[RequestRecord]:
    return RecordReader(store, "chat", "requests", lambda data: RequestRecord(**data), **kwargs)


def flush(sink: ObjectSink) -> bool:
    return asyncio.run(sink.flush())


def test_each_flush_is_one_object_and_the_reader_counts_per_router(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path)
    one, two = ObjectSink(store, "chat", "requests", "host-a"), ObjectSink(store, "chat", "requests", "host-b")
    for number in range(3):
        one.append(record(number))
    two.append(record(10))
    assert flush(one) and flush(two)
    one.append(record(3))
    assert flush(one)
    files = sorted(path.name for path in (tmp_path / "chat/requests/host-a").iterdir())
    assert len(files) == 2 and files[0] < files[1]  # names sort in write order
    assert not [path for path in tmp_path.rglob(".*")]  # no temporary file left behind

    found = reader(store).read()
    assert found.per_router == {"host-a": 4, "host-b": 1}
    assert sorted(item.request_id for item in found.records) == ["r0", "r1", "r10", "r2", "r3"]
    assert found.problems == []


def test_reading_is_incremental(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path)
    sink = ObjectSink(store, "chat", "requests", "host-a")
    records = reader(store)
    sink.append(record(1))
    flush(sink)
    assert [item.request_id for item in records.read().records] == ["r1"]
    assert records.read().records == []  # nothing new
    sink.append(record(2))
    flush(sink)
    later = records.read()
    assert [item.request_id for item in later.records] == ["r2"] and later.objects == 1
    assert records.totals == {"host-a": 2}


def test_the_window_selects_generations_and_arrivals(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path)
    sink = ObjectSink(store, "chat", "requests", "host-a")
    for number, (generation, arrival) in enumerate([(1, 100.0), (2, 150.0), (2, 250.0), (3, 260.0)]):
        sink.append(record(number, generation, arrival))
    flush(sink)
    found = reader(store).read(StageWindow(first_generation=2, last_generation=2, until_s=200.0))
    assert [item.request_id for item in found.records] == ["r1"]
    # Objects written before the window opened are not even read.
    assert reader(store).read(StageWindow(since_s=time.time() + 3600)).objects == 0


def test_an_unwritable_folder_holds_bounded_records_drops_oldest_then_recovers(tmp_path: Path) -> None:
    blocked = tmp_path / "records"
    blocked.write_text("a file where the folder should be")
    store = FolderRecordStore(blocked)
    sink = ObjectSink(store, "chat", "requests", "host-a", capacity=5)
    for number in range(3):
        sink.append(record(number))
    assert not flush(sink)  # the batch of three is kept under its name
    for number in range(3, 11):
        sink.append(record(number))  # five fit in the queue; the three oldest of these are dropped
    assert not flush(sink)
    health = sink.health()
    assert not health["ok"] and health["failures"] == 2 and health["dropped"] == 3 and health["held"] == 8
    assert "cannot write request records" in health["last_error"]

    blocked.unlink()
    assert flush(sink)
    assert sink.ok and sink.held == 0 and sink.written_records == 8
    found = reader(store).read()
    assert [item.request_id for item in found.records] == ["r0", "r1", "r2", "r6", "r7", "r8", "r9", "r10"]
    # The failed batch was written under its own name (no gap); the drops are reported with the router.
    assert [(problem.kind, problem.count) for problem in found.problems] == [("dropped", 3)]
    assert found.dropped == {"host-a": 3}


def test_corrupt_and_missing_objects_are_reported_not_skipped(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path)
    sink = ObjectSink(store, "chat", "requests", "host-a")
    for number in range(3):
        sink.append(record(number))
        flush(sink)
    files = sorted((tmp_path / "chat/requests/host-a").iterdir())
    files[1].unlink()  # the middle object is lost
    files[2].write_bytes(files[2].read_bytes() + b'{"request_id": truncated\n' + json.dumps({"x": 1}).encode())
    found = reader(store).read()
    assert [item.request_id for item in found.records] == ["r0", "r2"]
    kinds = sorted(problem.kind for problem in found.problems)
    assert kinds == ["corrupt", "corrupt", "gap"]
    assert all(problem.router == "host-a" for problem in found.problems)


def test_declared_labels_come_from_headers_and_body_metadata() -> None:
    body = json.dumps({"prompt": "hi", "metadata": {"revgate_task": "sql", "revgate_class": "batch",
                                                    "private": "x"}}).encode()
    assert _declared({}, parse_body(body)) == {"task": "sql", "class": "batch"}
    headers = {b"x-revgate-task": b"math", b"x-revgate-slices": b"lang=en"}
    assert _declared(headers, parse_body(body)) == {"task": "math", "class": "batch", "lang": "en"}
    assert _declared({}, parse_body(b'{"prompt": "no metadata"}')) == {}
    assert _declared({}, parse_body(b'{"metadata": [1]')) == {}  # unreadable: no labels, still served
    assert _declared({}, parse_body(b'{"metadata": [1]}')) == {}


def test_bad_store_url_and_router_id_are_typed_errors() -> None:
    with pytest.raises(RecordStoreInvalid, match="unsupported record store scheme"):
        open_record_store("ftp://host/records")
    with pytest.raises(RecordStoreInvalid, match="names no bucket"):
        open_record_store("s3:///records")
    with pytest.raises(RecordStoreInvalid, match="router id"):
        check_router_id("a/b")


def test_a_record_that_cannot_be_serialised_is_dropped_and_counted(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path)
    sink = ObjectSink(store, "chat", "requests", "host-a")
    sink.append(record(1))
    sink.append({"request_id": object()})  # not JSON
    sink.append(record(2))
    assert flush(sink)
    assert sink.dropped == 1 and sink.written_records == 2
    found = reader(store).read()
    assert [item.request_id for item in found.records] == ["r1", "r2"] and found.dropped == {"host-a": 1}
