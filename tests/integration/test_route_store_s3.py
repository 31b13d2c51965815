"""The S3 route store against a real S3 wire-protocol server: conditional writes as compare-and-swap."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import boto3
import pytest

from revgate.manifests.errors import ManifestInvalid
from revgate.manifests.route import RouteConflict, RouteSnapshot, RouteStoreUnavailable
from revgate.registry.route_store import open_route_store
from revgate.registry.route_store_s3 import ConditionalWritesIgnored, S3RouteStore
from tests.integration.s3_proxy import ignoring_conditions, losing_answers

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


def test_routes_lists_every_route_under_the_prefix_and_no_other(store: S3RouteStore, s3_endpoint: str) -> None:
    assert store.routes() == []
    store.write(snap(1))
    store.write(snap(1).model_copy(update={"route": "billing"}))
    # Another prefix in the same bucket is another store.
    open_route_store(f"s3://{store.bucket}/staging?endpoint_url={s3_endpoint}").write(
        snap(1).model_copy(update={"route": "search"}))
    assert store.routes() == ["billing", "chat"]


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


def test_corrupt_current_is_read_from_history_and_repaired(store: S3RouteStore) -> None:
    store.write(snap(1))
    store.client.put_object(Bucket=store.bucket, Key="prod/chat/current.json", Body=b"{not json")
    current = store.read("chat")
    assert current is not None and current.generation == 1
    store.write(snap(2, OTHER))
    body = store.client.get_object(Bucket=store.bucket, Key="prod/chat/current.json")["Body"].read()
    assert body == snap(2, OTHER).canonical()


def test_corrupt_current_without_history_is_a_typed_error(store: S3RouteStore) -> None:
    store.client.put_object(Bucket=store.bucket, Key="prod/chat/current.json", Body=b"{not json")
    with pytest.raises(ManifestInvalid):
        store.read("chat")


def test_a_writer_that_died_after_history_is_committed(store: S3RouteStore) -> None:
    store.write(snap(1))
    store.client.put_object(Bucket=store.bucket, Key="prod/chat/history/000000000002.json",
                            Body=snap(2, OTHER).canonical())
    current = store.read("chat")
    assert current is not None and current.generation == 2
    with pytest.raises(RouteConflict):
        store.write(snap(2, STABLE, by="late"))
    store.write(snap(3))
    assert [item.generation for item in store.history("chat")] == [1, 2, 3]


def test_moto_honours_conditional_writes_so_the_probe_passes(store: S3RouteStore) -> None:
    store.check_conditional_writes()
    listed = store.client.list_objects_v2(Bucket=store.bucket, Prefix="prod/.revgate-probe/")
    assert listed.get("KeyCount", 0) == 0  # the probe cleans up after itself


def test_an_endpoint_that_ignores_conditional_writes_is_refused_before_any_write(s3_endpoint: str) -> None:
    bucket = f"routes-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    with ignoring_conditions(s3_endpoint) as careless:
        found = open_route_store(f"s3://{bucket}/prod?endpoint_url={careless}")
        with pytest.raises(ConditionalWritesIgnored, match="If-None-Match and If-Match") as caught:
            found.write(snap(1))
    assert "compare-and-swap" in caught.value.what and caught.value.fix
    assert boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_a_retried_write_that_had_landed_is_a_commit_not_a_conflict(s3_endpoint: str) -> None:
    # The defect: the first PUT of history/N landed but its answer was lost; boto3 retried, the
    # retry's If-None-Match failed against our own object, and the flow took itself for another writer.
    bucket = f"routes-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    lost: list[str] = []

    def lose_first_history_put(method: str, path: str) -> bool:
        if method == "PUT" and "/history/" in path and not lost:
            lost.append(path)
            return True
        return False

    with losing_answers(s3_endpoint, lose_first_history_put) as proxy:
        store = open_route_store(f"s3://{bucket}/prod?endpoint_url={proxy}")
        store.write(snap(1))
    assert lost, "no answer was lost: the test did not exercise the retry"
    current = open_route_store(f"s3://{bucket}/prod?endpoint_url={s3_endpoint}").read("chat")
    assert current is not None and current.generation == 1


def test_a_store_that_does_not_answer_fails_within_seconds_not_minutes(s3_endpoint: str) -> None:
    # boto3's defaults (60 s read timeout, retried) held a router's poll and the flow for minutes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepts connections (in the backlog), never answers
        store = open_route_store(f"s3://routes/prod?endpoint_url=http://127.0.0.1:{silent.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(RouteStoreUnavailable) as raised:
            store.read("chat")
    assert time.monotonic() - started < 30
    assert "route store" in str(raised.value)
