"""The request-record sink and its reader over a folder: objects per flush, bounded memory, incremental reads."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from revgate.evaluation.records import RequestRecord
from revgate.registry.record_signing import RecordKeyInvalid, load_public_key, load_signer, new_key_pair, signer_keys
from revgate.registry.record_store import (
    FolderRecordStore,
    ObjectName,
    RecordReader,
    RecordStoreInvalid,
    StageWindow,
    check_router_id,
    open_record_store,
    parse_name,
)
from revgate.serving.router.parse import parse_body
from revgate.serving.router.records import line_bytes
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


# --- signed objects: who wrote what ------------------------------------------------------------


def signed_sink(store: FolderRecordStore, router: str, tmp_path: Path) -> tuple[ObjectSink, Any]:
    signer = new_key_pair(tmp_path / f"{router}.key")
    return ObjectSink(store, "chat", "requests", router, signer=signer), signer.private.public_key()


def one_object(store: FolderRecordStore, router: str) -> Path:
    (path,) = (store.root / "chat/requests" / router).iterdir()
    return path


def test_a_signed_object_verifies_and_a_reader_without_keys_skips_its_signature(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path / "store")
    sink, public = signed_sink(store, "host-a", tmp_path)
    sink.append(record(1))
    sink.append(record(2))
    assert flush(sink) and sink.health()["signed"]
    assert b'"revgate_record_signature"' in one_object(store, "host-a").read_bytes().splitlines()[-1]
    found = reader(store, keys={"host-a": public}).read()
    assert [item.request_id for item in found.records] == ["r1", "r2"] and found.problems == []
    assert found.origins == [("host-a", str(one_object(store, "host-a")))] * 2
    unkeyed = reader(store).read()  # no keys: as before, and the signature line is no record
    assert [item.request_id for item in unkeyed.records] == ["r1", "r2"] and unkeyed.problems == []


def forged_kinds(found: Any) -> list[tuple[str, str, str]]:
    return [(problem.kind, problem.router, problem.where) for problem in found.problems]


def test_a_changed_byte_a_renamed_object_and_an_unsigned_object_are_refused_with_their_keys(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path / "store")
    sink, public = signed_sink(store, "host-a", tmp_path)
    sink.append(record(1))
    flush(sink)
    real = one_object(store, "host-a")
    name = parse_name("chat", "requests", "host-a", real.name)
    assert name is not None
    data = real.read_bytes()
    later = replace(name, written_ms=name.written_ms + 1, sequence=name.sequence + 1)
    changed = replace(name, written_ms=name.written_ms + 2, sequence=name.sequence + 2)
    unsigned = replace(name, written_ms=name.written_ms + 3, sequence=name.sequence + 3)
    store.put(later.key, data)  # the real bytes under another name
    store.put(changed.key, data.replace(b'"r1"', b'"r9"'))  # one record altered
    store.put(unsigned.key, line_bytes(record(7)))  # no signature at all
    found = reader(store, keys={"host-a": public}).read()
    assert [item.request_id for item in found.records] == ["r1"]  # the real object alone
    assert forged_kinds(found) == [("forged", "host-a", store.where(key)) for key in (later.key, changed.key,
                                                                                      unsigned.key)]
    assert "no signature line" in found.problems[2].detail and "does not match" in found.problems[0].detail


def test_an_object_copied_into_another_routers_folder_is_refused(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path / "store")
    one, public_one = signed_sink(store, "host-a", tmp_path)
    _two, public_two = signed_sink(store, "host-b", tmp_path)
    one.append(record(1))
    flush(one)
    real = one_object(store, "host-a")
    copy = f"chat/requests/host-b/{real.name}"
    store.put(copy, real.read_bytes())  # signed by host-a's key, under host-b's name
    found = reader(store, keys={"host-a": public_one, "host-b": public_two}).read()
    assert [(item.request_id, origin) for item, origin in zip(found.records, found.origins, strict=True)] == [
        ("r1", ("host-a", str(real)))]
    assert forged_kinds(found) == [("forged", "host-b", store.where(copy))]


def test_objects_of_a_router_not_named_are_counted_never_read(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path / "store")
    named, public = signed_sink(store, "host-a", tmp_path)
    stranger, _ = signed_sink(store, "stranger", tmp_path)  # signs well, with a key the route does not name
    named.append(record(1))
    stranger.append(record(2))
    stranger.append(record(3))
    flush(named)
    flush(stranger)
    records = reader(store, keys={"host-a": public})
    found = records.read()
    assert [item.request_id for item in found.records] == ["r1"] and found.per_router == {"host-a": 1}
    assert [(p.kind, p.router, p.where, p.count) for p in found.problems] == [
        ("unnamed", "stranger", store.where("chat/requests/stranger/"), 1)]
    assert records.read().problems == []  # reported once
    with pytest.raises(RecordStoreInvalid, match="no public key for router"):
        reader(store, routers=["host-a", "host-b"], keys={"host-a": public})


def test_a_forged_name_neither_skips_the_routers_later_objects_nor_hides_a_gap(tmp_path: Path) -> None:
    store = FolderRecordStore(tmp_path / "store")
    sink, public = signed_sink(store, "host-a", tmp_path)
    records = reader(store, keys={"host-a": public})
    sink.append(record(1))
    flush(sink)
    assert [item.request_id for item in records.read().records] == ["r1"]
    # Names sorting after every real one: a far-future time under another boot, and a name no router writes.
    future = ObjectName("chat", "requests", "host-a", 9_999_999_999_999, "zz", 0, 0)
    store.put(future.key, line_bytes(record(66)))
    store.put("chat/requests/host-a/zzzz.jsonl", line_bytes(record(67)))
    first = records.read()
    assert first.records == [] and sorted(p.kind for p in first.problems) == ["forged", "forged"]
    sink.sequence += 1  # the router's next object goes missing
    sink.append(record(2))
    flush(sink)
    sink.append(record(3))
    flush(sink)
    later = records.read()
    assert [item.request_id for item in later.records] == ["r2", "r3"]  # still read, after the forged names
    assert [(p.kind, p.count) for p in later.problems] == [("gap", 1)]  # the forged objects are not reported again


def test_router_keys_are_made_private_and_a_readable_or_foreign_key_is_refused(tmp_path: Path) -> None:
    signer = new_key_pair(tmp_path / "router.key")
    assert (tmp_path / "router.key").stat().st_mode & 0o777 == 0o600
    assert load_signer(tmp_path / "router.key").public_pem() == signer.public_pem()
    with pytest.raises(RecordKeyInvalid, match="already there"):
        new_key_pair(tmp_path / "router.key")
    (tmp_path / "router.key").chmod(0o644)
    with pytest.raises(RecordKeyInvalid, match="readable by other users"):
        load_signer(tmp_path / "router.key")
    assert load_public_key(signer.public_pem().decode(), "x").public_bytes_raw() == \
        signer.private.public_key().public_bytes_raw()
    (tmp_path / "router.pub").write_bytes(signer.public_pem())
    assert signer_keys({"host-a": str(tmp_path / "router.pub")})["host-a"] == signer.private.public_key()
    with pytest.raises(RecordKeyInvalid, match=r"record_signers\.host-b"):
        signer_keys({"host-b": str(tmp_path / "absent.pub")})
    with pytest.raises(RecordKeyInvalid, match="not a PEM public key"):
        load_public_key("-----BEGIN PUBLIC KEY-----\nnonsense\n-----END PUBLIC KEY-----\n", "x")


def test_the_router_command_refuses_a_key_without_a_sink_and_a_key_others_can_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from revgate.cli.main import main

    new_key_pair(tmp_path / "router.key")
    base = ["router", "--routes", str(tmp_path / "routes"), "--records-key", str(tmp_path / "router.key")]
    assert main(base) == 2
    assert "no --records-sink is given" in capsys.readouterr().err
    (tmp_path / "router.key").chmod(0o640)
    assert main([*base, "--records-sink", str(tmp_path / "records")]) == 2
    assert "readable by other users" in capsys.readouterr().err
