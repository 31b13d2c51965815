"""`revgate rollback` through the real route stores, with no Prefect and no MLflow involved."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest

from manifests.route import RevisionTarget, RouteSnapshot
from manifests.route_change import canary, successor
from registry.route_store import open_route_store
from tests.integration.commands import revgate

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))


def seed_history(url: str) -> list[RouteSnapshot]:
    store = open_route_store(url)
    first = RouteSnapshot.build(route="chat", generation=1, stable=STABLE, created_by="seed", created_at=NOW)
    with_canary = successor(first, by="flow", now=NOW, candidate=canary(CANDIDATE, 50_000, NOW, 600))
    promoted = successor(with_canary, by="flow", now=NOW, stable=CANDIDATE, candidate=None)
    for snapshot in (first, with_canary, promoted):
        store.write(snapshot)
    return [first, with_canary, promoted]


@pytest.fixture
def file_store(tmp_path: Path) -> str:
    return str(tmp_path / "routes")


@pytest.fixture
def s3_store(s3_endpoint: str) -> str:
    bucket = f"routes-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/prod?endpoint_url={s3_endpoint}"


@pytest.mark.servers
@pytest.mark.parametrize("store_fixture", ["file_store", "s3_store"])
def test_rollback_reverts_the_last_promotion_atomically(store_fixture: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(store_fixture)
    seed_history(url)
    dry = revgate("rollback", "--routes", url, "--route", "chat", "--dry-run", "--created-by", "oncall")
    assert dry.returncode == 0, dry.stderr
    assert "nothing committed" in dry.stdout
    assert open_route_store(url).read("chat").generation == 3  # type: ignore[union-attr]

    done = revgate("rollback", "--routes", url, "--route", "chat", "--created-by", "oncall")
    assert done.returncode == 0, done.stderr
    current = open_route_store(url).read("chat")
    assert current is not None and current.generation == 4
    assert current.stable.fingerprint == STABLE.fingerprint and current.created_by == "oncall"
    assert [snap.generation for snap in open_route_store(url).history("chat")] == [1, 2, 3, 4]


@pytest.mark.servers
def test_rollback_of_a_route_that_never_changed_fails_and_commits_nothing(file_store: str) -> None:
    store = open_route_store(file_store)
    store.write(RouteSnapshot.build(route="chat", generation=1, stable=STABLE, created_by="seed", created_at=NOW))
    result = revgate("rollback", "--routes", file_store, "--route", "chat")
    assert result.returncode == 2
    assert "NothingToRollBack" in result.stderr and "only ever served one revision" in result.stderr
    assert [snap.generation for snap in store.history("chat")] == [1]
