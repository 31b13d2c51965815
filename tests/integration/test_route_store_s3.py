"""The S3 route store against a real S3 wire-protocol server: conditional writes as compare-and-swap."""

from __future__ import annotations

import threading
import uuid

import boto3
import pytest

from manifests.errors import ManifestInvalid
from manifests.route import RouteConflict, RouteSnapshot
from registry.route_store import S3RouteStore, open_route_store

pytestmark = pytest.mark.servers

STABLE = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def snap(generation: int, fingerprint: str = STABLE, by: str = "ops") -> RouteSnapshot:
    return RouteSnapshot.build(route="chat", generation=generation, created_by=by, created_at="2026-11-29T10:00:00Z",
                               stable={"fingerprint": fingerprint, "endpoints": ["http://127.0.0.1:8000"]})


@pytest.fixture
def store(s3_endpoint: str) -> S3RouteStore:
    bucket = f"routes-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    found = open_route_store(f"s3://{bucket}/prod?endpoint_url={s3_endpoint}")
    assert isinstance(found, S3RouteStore)
    return found


def test_compare_and_swap_and_history(store: S3RouteStore) -> None:
    assert store.read("chat") is None
    store.write(snap(1))
    store.write(snap(2, OTHER))
    current = store.read("chat")
    assert current is not None and current.generation == 2 and current.stable.fingerprint == OTHER
    assert [item.generation for item in store.history("chat")] == [1, 2]


def test_stale_generation_is_refused_and_changes_nothing(store: S3RouteStore) -> None:
    store.write(snap(1))
    store.write(snap(2))
    with pytest.raises(RouteConflict) as caught:
        store.write(snap(2, OTHER, by="late"))
    assert "generation 2" in str(caught.value)
    current = store.read("chat")
    assert current is not None and current.stable.fingerprint == STABLE
    assert [item.created_by for item in store.history("chat")] == ["ops", "ops"]


def test_racing_writers_commit_exactly_once(store: S3RouteStore) -> None:
    store.write(snap(1))
    outcomes: list[str] = []

    def write(by: str) -> None:
        try:
            store.write(snap(2, OTHER, by=by))
            outcomes.append(by)
        except RouteConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=write, args=(f"w{index}",)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [outcome for outcome in outcomes if outcome != "conflict"]
    assert len(winners) == 1
    current = store.read("chat")
    assert current is not None and current.created_by == winners[0]
    assert [item.created_by for item in store.history("chat")] == ["ops", winners[0]]


def test_corrupt_object_is_a_typed_error(store: S3RouteStore) -> None:
    store.write(snap(1))
    store.client.put_object(Bucket=store.bucket, Key="prod/chat/current.json", Body=b"{not json")
    with pytest.raises(ManifestInvalid):
        store.read("chat")
