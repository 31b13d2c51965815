"""One rollout per route: a second promotion on a locked route is refused and moves no traffic."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from revgate.flows.spec import PromotionSpec
from revgate.manifests.gates import GatePolicy
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.registry.route_store import open_route_store
from revgate.serving.worker.request import SignaturePolicySpec

pytestmark = pytest.mark.servers


def spec(tmp_path: Path, route: str) -> PromotionSpec:
    unreachable = "http://127.0.0.1:9"  # never contacted: the lock is taken first
    return PromotionSpec(
        route=route, candidate_manifest="sha256:" + "2" * 64, artifact_store=str(tmp_path / "artifacts"),
        route_store=str(tmp_path / "routes"), signature=SignaturePolicySpec(kind="key", public_key="k.pub"),
        gate_policy=GatePolicy(), worker_url=unreachable, worker_token_file="t", router_url=unreachable,
        router_admin_url=unreachable, router_admin_token_file="t", records_sink=str(tmp_path / "records"), trace="t",
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", evidence_root=str(tmp_path / "evidence"),
    )


def test_a_concurrent_rollout_is_refused_and_changes_nothing(prefect_api: str, tmp_path: Path) -> None:
    from prefect.concurrency.sync import concurrency

    from revgate.flows.promote import RolloutInProgress, ensure_route_lock, lock_name, promote_revision

    store = open_route_store(str(tmp_path / "routes"))
    stable = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
    now = datetime.now(UTC)
    store.write(RouteSnapshot(route="locked", generation=1, stable=stable, created_by="t", created_at=now))
    ensure_route_lock("locked")
    with concurrency(lock_name("locked"), occupy=1, strict=True), pytest.raises(RolloutInProgress) as caught:
        promote_revision(spec(tmp_path, "locked"))
    assert "already has a rollout in progress" in str(caught.value)
    assert [snap.generation for snap in store.history("locked")] == [1]
    assert not (tmp_path / "mlflow.db").exists()  # refused before any evidence run was opened
