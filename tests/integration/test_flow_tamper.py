"""A tampered candidate is refused by the promotion flow before anything is loaded or any traffic moves.

Real parts: the zoo's signed revision in a real artifact store, one weight byte flipped in the store,
the flow on a real Prefect server, MLflow on SQLite, the file route store.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from revgate.flows.demo import publish, signing_key
from revgate.manifests.errors import RevgateError
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.registry.route_store import open_route_store
from revgate.serving.worker.request import SignaturePolicySpec
from revgate.zoo.index import load_revisions
from tests.integration.test_flow_fence import fenced_spec

pytestmark = pytest.mark.servers


@pytest.mark.timeout(600)
def test_a_tampered_candidate_is_refused_before_any_traffic_moves(
    zoo_dir: Path, prefect_api: str, tmp_path: Path
) -> None:
    from revgate.flows.promote import promote_revision
    from revgate.manifests.rollout import RolloutPlan, SetWeight

    key, public = signing_key(tmp_path / "keys")
    store = tmp_path / "artifacts"
    digest = publish(zoo_dir / load_revisions(zoo_dir)["improved"].path, str(store), key, tmp_path / "signatures")
    shard = max((store / "blobs" / "sha256").iterdir(), key=lambda blob: blob.stat().st_size)
    shard.chmod(0o644)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight
    shard.write_bytes(bytes(data))

    stable = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
    routes = open_route_store(str(tmp_path / "routes"))
    routes.write(RouteSnapshot(route="tampered", generation=1, stable=stable, created_by="seed",
                               created_at=datetime.now(UTC)))
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)], lease_seconds=20)
    spec = fenced_spec(tmp_path, "tampered", plan).model_copy(update={
        "candidate_manifest": digest, "artifact_store": str(store),
        "signature": SignaturePolicySpec(kind="key", public_key=str(public)),
    })
    with pytest.raises(RevgateError) as refused:
        promote_revision(spec)
    assert "sha256" in str(refused.value) or "digest" in str(refused.value).lower()
    assert [s.generation for s in routes.history("tampered")] == [1]  # no traffic moved
    client = MlflowClient(spec.tracking_uri)
    experiment = client.get_experiment_by_name("revgate/tampered")
    assert experiment is not None
    run = client.search_runs([experiment.experiment_id])[0]
    assert run.data.tags["revgate.decision"] == "failed"
    assert "revgate.step.verify" not in run.data.tags and "revgate.step.load" not in run.data.tags
