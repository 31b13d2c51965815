"""The file route store: compare-and-swap, append-only history, corrupt files refused."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from manifests.errors import ManifestInvalid
from manifests.route import RouteConflict, RouteSnapshot
from registry.route_store import FileRouteStore, open_route_store

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


def test_corrupt_current_file_is_a_typed_error(tmp_path: Path) -> None:
    store = FileRouteStore(tmp_path)
    store.write(snap(1))
    (tmp_path / "chat" / "current.json").write_text('{"route": "chat"')
    with pytest.raises(ManifestInvalid):
        store.read("chat")


def test_open_route_store_understands_paths_and_urls(tmp_path: Path) -> None:
    assert isinstance(open_route_store(str(tmp_path)), FileRouteStore)
    assert isinstance(open_route_store(f"file://{tmp_path}"), FileRouteStore)
