"""The file route store: compare-and-swap, append-only history, durable writes, self-healing reads."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from revgate.manifests.errors import ManifestInvalid, NotCanonical
from revgate.manifests.route import RouteConflict, RouteSnapshot
from revgate.registry.route_store import FileRouteStore, open_route_store

STABLE = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def snap(generation: int, fingerprint: str = STABLE, by: str = "ops") -> RouteSnapshot:
    return RouteSnapshot.build(route="chat", generation=generation, created_by=by,
                               created_at="2026-11-29T10:00:00Z",
                               stable={"fingerprint": fingerprint, "endpoints": ["http://127.0.0.1:8000"]})


def test_write_read_and_history(tmp_path: Path) -> None:
    store = FileRouteStore(tmp_path)
    assert store.read("chat") is None
    store.write(snap(1))
    store.write(snap(2, OTHER))
    current = store.read("chat")
    assert current is not None and current.generation == 2 and current.stable.fingerprint == OTHER
    assert [item.generation for item in store.history("chat")] == [1, 2]


def test_routes_lists_routes_with_a_committed_generation(tmp_path: Path) -> None:
    store = FileRouteStore(tmp_path / "routes")
    assert store.routes() == []  # no folder yet: no routes, nothing created
    assert not (tmp_path / "routes").exists()
    store.write(snap(1))
    store.write(snap(1).model_copy(update={"route": "billing"}))
    (tmp_path / "routes" / "empty").mkdir()  # a folder without history is no route
    (tmp_path / "routes" / "Not A Route").mkdir()
    assert store.routes() == ["billing", "chat"]


def test_stale_generation_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    store = FileRouteStore(tmp_path)
    store.write(snap(1))
    store.write(snap(2))
    before = sorted(path.name for path in tmp_path.rglob("*"))
    with pytest.raises(RouteConflict) as caught:
        store.write(snap(2, OTHER, by="late-writer"))
    assert "generation 2" in str(caught.value)
    current = store.read("chat")
    assert current is not None and current.stable.fingerprint == STABLE
    assert sorted(path.name for path in tmp_path.rglob("*")) == before


def test_concurrent_writers_of_one_generation_commit_exactly_once(tmp_path: Path) -> None:
    store = FileRouteStore(tmp_path)
    store.write(snap(1))
    outcomes: list[str] = []

    def write(by: str) -> None:
        try:
            store.write(snap(2, OTHER, by=by))
            outcomes.append("committed")
        except RouteConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=write, args=(f"writer-{index}",)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["committed"] + ["conflict"] * 7
    assert [item.generation for item in store.history("chat")] == [1, 2]


def test_corrupt_current_file_is_read_from_history_and_repaired_by_the_next_write(tmp_path: Path) -> None:
    store = FileRouteStore(tmp_path)
    store.write(snap(1))
    (tmp_path / "chat" / "current.json").write_text('{"route": "chat"')
    current = store.read("chat")
    assert current is not None and current.generation == 1
    store.write(snap(2, OTHER))
    assert (tmp_path / "chat" / "current.json").read_bytes() == snap(2, OTHER).canonical()


def test_corrupt_current_file_without_history_is_a_typed_error(tmp_path: Path) -> None:
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "current.json").write_text('{"route": "chat"')
    with pytest.raises(ManifestInvalid):
        FileRouteStore(tmp_path).read("chat")


def test_non_canonical_bytes_are_not_read_as_a_snapshot(tmp_path: Path) -> None:
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "current.json").write_text(snap(1).model_dump_json(indent=2))
    with pytest.raises(NotCanonical):
        FileRouteStore(tmp_path).read("chat")


def test_a_writer_that_died_after_history_is_committed_and_current_catches_up(tmp_path: Path) -> None:
    store = FileRouteStore(tmp_path)
    store.write(snap(1))
    # The writer of generation 2 committed its history entry, then died before replacing current.
    (tmp_path / "chat" / "history" / "000000000002.json").write_bytes(snap(2, OTHER).canonical())
    current = store.read("chat")
    assert current is not None and current.generation == 2 and current.stable.fingerprint == OTHER
    with pytest.raises(RouteConflict):
        store.write(snap(2, STABLE, by="late-writer"))
    store.write(snap(3))
    assert [item.generation for item in store.history("chat")] == [1, 2, 3]
    assert (tmp_path / "chat" / "current.json").read_bytes() == snap(3).canonical()


def test_lost_or_corrupt_history_entries_are_left_out_and_the_newest_is_last(tmp_path: Path) -> None:
    store = FileRouteStore(tmp_path)
    for generation in (1, 2, 3):
        store.write(snap(generation, OTHER if generation == 2 else STABLE))
    history = tmp_path / "chat" / "history"
    (history / "000000000001.json").write_text("{torn")
    (history / "000000000003.json").unlink()
    assert [item.generation for item in store.history("chat")] == [2, 3]
    store.write(snap(4))  # repairs the newest generation's entry from current
    assert (history / "000000000003.json").read_bytes() == snap(3).canonical()
    assert [item.generation for item in store.history("chat")] == [2, 3, 4]


def test_every_name_is_fsynced_after_its_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

    def fsync(fd: int) -> None:
        events.append("fsync-folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def named(kind: str, real: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def call(source: Any, target: Any) -> None:
            events.append(f"{kind} {Path(target).relative_to(tmp_path)}")
            real(source, target)
        return call

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", named("rename", real_replace))
    monkeypatch.setattr(os, "link", named("link", real_link))
    FileRouteStore(tmp_path).write(snap(1))
    assert events == ["fsync-file", "link chat/history/000000000001.json", "fsync-folder",
                      "fsync-file", "rename chat/current.json", "fsync-folder"]


def test_open_route_store_understands_paths_and_urls(tmp_path: Path) -> None:
    assert isinstance(open_route_store(str(tmp_path)), FileRouteStore)
    assert isinstance(open_route_store(f"file://{tmp_path}"), FileRouteStore)
