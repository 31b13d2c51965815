"""A tampered candidate is refused before any traffic moves: by the flow when its signature is not the
policy's, by the worker agent when its bytes are not the manifest's.

Real parts: the zoo's signed revision in a real artifact store, a real worker agent (no weights ever
come to the controller: it checks the manifest and its signature, the agent the bytes it loads), the
flow on a real Prefect server, MLflow on SQLite, the file route store.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from revgate.flows import processes, steps
from revgate.flows.demo import publish, signing_key
from revgate.flows.spec import PromotionSpec
from revgate.manifests.errors import RevgateError
from revgate.manifests.rollout import RolloutPlan, SetWeight
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.registry.route_store import open_route_store
from revgate.serving.worker.client import WorkerClient
from revgate.serving.worker.request import SignaturePolicySpec
from revgate.zoo.index import load_revisions
from tests.integration.test_flow_fence import fenced_spec

pytestmark = pytest.mark.servers

STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))


def tampered_spec(tmp_path: Path, zoo_dir: Path, route: str, worker_url: str, token: Path, *,
                  signed_by: str) -> PromotionSpec:
    """The zoo's ``improved`` published and signed with ``signed_by``'s key; the policy trusts ``publisher``."""
    _, public = signing_key(tmp_path / "keys", "publisher")
    key, _ = signing_key(tmp_path / "keys", signed_by)
    store = tmp_path / "artifacts"
    digest = publish(zoo_dir / load_revisions(zoo_dir)["improved"].path, str(store), key, tmp_path / "signatures")
    open_route_store(str(tmp_path / "routes")).write(RouteSnapshot(route=route, generation=1, stable=STABLE,
                                                                  created_by="seed", created_at=datetime.now(UTC)))
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)], lease_seconds=20)
    return fenced_spec(tmp_path, route, plan).model_copy(update={
        "candidate_manifest": digest, "artifact_store": str(store), "worker_url": worker_url,
        "worker_token_file": str(token), "signature": SignaturePolicySpec(kind="key", public_key=str(public)),
    })


def decided(spec: PromotionSpec) -> dict[str, str]:
    client = MlflowClient(spec.tracking_uri)
    experiment = client.get_experiment_by_name(f"revgate/{spec.route}")
    assert experiment is not None
    return dict(client.search_runs([experiment.experiment_id])[0].data.tags)


@pytest.mark.timeout(600)
def test_a_candidate_signed_by_another_key_is_refused_by_the_flow_before_any_agent_fetches_it(
    zoo_dir: Path, prefect_api: str, tmp_path: Path
) -> None:
    from revgate.flows.promote import promote_revision

    token = processes.token_file(tmp_path / "agent-token")
    with processes.worker_agent(tmp_path / "agent", token) as worker_url:
        spec = tampered_spec(tmp_path, zoo_dir, "untrusted", worker_url, token, signed_by="intruder")
        with pytest.raises(RevgateError) as refused:
            promote_revision(spec)
        assert WorkerClient(worker_url, token.read_text().strip()).replicas() == []  # no agent was asked
    assert "signature" in str(refused.value).lower() or "signer" in str(refused.value).lower(), refused.value
    assert [s.generation for s in open_route_store(spec.route_store).history("untrusted")] == [1]  # no traffic
    tags = decided(spec)
    assert tags["revgate.decision"] == "failed"
    assert "revgate.step.verify" not in tags and "revgate.step.load" not in tags
    assert not list((tmp_path / "evidence").rglob("*.safetensors"))  # no weights came to the controller


@pytest.mark.timeout(600)
def test_a_tampered_weight_passes_the_controllers_check_and_the_agent_refuses_it_before_loading(
    zoo_dir: Path, tmp_path: Path
) -> None:
    token = processes.token_file(tmp_path / "agent-token")
    with processes.worker_agent(tmp_path / "agent", token) as worker_url:
        spec = tampered_spec(tmp_path, zoo_dir, "tampered", worker_url, token, signed_by="publisher")
        shard = max((tmp_path / "artifacts" / "blobs" / "sha256").iterdir(), key=lambda blob: blob.stat().st_size)
        shard.chmod(0o644)
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01  # one bit of one weight
        shard.write_bytes(bytes(data))
        revision, engine = steps.pin(spec)  # the runtime is the agent's: this controller has no engine
        assert engine.url == worker_url and revision.runtime == engine.runtime
        assert "verify_s" in steps.verify(spec, revision, tmp_path / "signatures-checked")  # manifest and signer
        client = WorkerClient(worker_url, token.read_text().strip())
        replica = client.start(steps.replica_request(spec, revision))
        view = client.wait_for(str(replica.replica_id), {"ready"}, 300)
    assert view.state == "failed", view
    reason = view.reason
    assert "sha256" in reason or "digest" in reason.lower(), reason  # re-hashed where it is loaded
    assert [s.generation for s in open_route_store(spec.route_store).history("tampered")] == [1]  # no traffic


@pytest.mark.timeout(600)
def test_a_candidate_the_agents_engine_cannot_run_is_refused_by_the_flow_before_any_agent_starts_it(
    zoo_dir: Path, prefect_api: str, tmp_path: Path
) -> None:
    # The defect: only the agent checked the fit, while loading; the controller started a replica that could
    # only fail. Now the flow reads config.json alone (checked against the manifest) and each agent's report.
    from revgate.flows.promote import promote_revision

    token = processes.token_file(tmp_path / "agent-token")
    with processes.worker_agent(tmp_path / "agent", token) as worker_url:
        spec = tampered_spec(tmp_path, zoo_dir, "unfit", worker_url, token, signed_by="publisher")
        limit = json.loads((zoo_dir / load_revisions(zoo_dir)["improved"].path / "config.json").read_text())
        too_long = limit["max_position_embeddings"] * 2
        spec = spec.model_copy(update={"execution": spec.execution.model_copy(update={"max_model_len": too_long})})
        with pytest.raises(RevgateError) as refused:
            promote_revision(spec)
        assert WorkerClient(worker_url, token.read_text().strip()).replicas() == []  # no agent was asked to start
    message = str(refused.value)
    assert "execution.max_model_len" in message and worker_url in message, message
    assert f"max_model_len {too_long} exceeds the model's position limit" in message, message
    assert [s.generation for s in open_route_store(spec.route_store).history("unfit")] == [1]  # no traffic
    tags = decided(spec)
    assert tags["revgate.decision"] == "failed" and "revgate.step.load" not in tags
    assert not list((tmp_path / "evidence").rglob("*.safetensors"))  # only the config came to the controller
