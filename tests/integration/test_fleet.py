"""A rollout beyond one host: two worker agents, two routers sharing a route store on an S3 server.

Real parts throughout: worker agents with vLLM on the CPU, `revgate router` processes reading the
route from moto's S3 server, the promotion flow as `revgate promote` against the Prefect server.
The plan asks for two candidate replicas: one lands on each agent, the route lists both, and a
step counts as applied only once both routers serve its generation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import boto3
import httpx
import pytest
from mlflow.tracking import MlflowClient

from flows import processes
from flows.demo import EXECUTION, demo_policy
from flows.spec import PromotionSpec
from manifests.rollout import Bake, RolloutPlan, SetWeight
from manifests.route import RouteSnapshot
from registry.route_store import open_route_store
from serving.worker.client import WorkerClient
from tests.integration.rollout_estate import WARM, estate

pytestmark = [pytest.mark.engine, pytest.mark.servers]

ROUTE = "fleet"


def routes_on_s3(endpoint: str) -> str:
    """A fresh bucket's route-store URL on the S3 server."""
    bucket = f"routes-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/routes?endpoint_url={endpoint}"


def generation_served(admin_url: str, token: str) -> int:
    """The generation a router serves, from its admin health."""
    health = httpx.get(f"{admin_url}/admin/health", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    return int(health.json()["generation"])


def test_the_candidate_runs_on_every_agent_and_every_router_serves_each_generation(
    zoo_dir: Path, prefect_api: str, s3_endpoint: str, tmp_path: Path
) -> None:
    with estate(zoo_dir, prefect_api, tmp_path / "estate") as parts, \
            processes.worker_agent(tmp_path / "second-agent", parts.token) as second_agent:
        routes = routes_on_s3(s3_endpoint)
        open_route_store(routes).write(RouteSnapshot(route=ROUTE, generation=1, stable=parts.stable(),
                                                     created_by="seed", created_at=datetime.now(UTC)))
        token = parts.token.read_text().strip()
        with processes.router(routes, ROUTE, tmp_path / "router-a", parts.token) as (url_a, admin_a), \
                processes.router(routes, ROUTE, tmp_path / "router-b", parts.token) as (url_b, admin_b):
            plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Bake(seconds=2)], lease_seconds=60,
                                     rollback_window_seconds=0, candidate_replicas=2)
            tracking = f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
            spec = PromotionSpec(
                route=ROUTE, candidate_manifest=parts.digests["improved"], candidate_name="improved",
                artifact_store=parts.store, route_store=routes, signature=parts.policy, execution=EXECUTION,
                warm=WARM, gate_policy=demo_policy(), plan=plan, worker_url=parts.worker_url,
                more_workers=(second_agent,), worker_token_file=str(parts.token), router_url=url_a,
                router_admin_url=admin_a, more_routers=(admin_b,), router_admin_token_file=str(parts.token),
                paired_records=str(tmp_path / "router-a" / "paired.jsonl"),
                router_records=str(tmp_path / "router-a" / "records.jsonl"), trace=str(tmp_path / "trace.jsonl"),
                tracking_uri=tracking, evidence_root=str(tmp_path / "evidence"), approval="auto",
            )
            spec_file = tmp_path / "promotion.json"
            spec_file.write_text(spec.model_dump_json(indent=2), encoding="utf-8")
            result = subprocess.run([sys.executable, "-m", "cli.main", "promote", str(spec_file)],
                                    env={**os.environ, "PREFECT_API_URL": prefect_api}, capture_output=True,
                                    text=True, timeout=900, check=False)
            assert result.returncode == 0 and "decision: promoted" in result.stdout, (
                result.stdout[-3000:] + result.stderr[-3000:])

            history = list(open_route_store(routes).history(ROUTE))
            final = history[-1]
            assert final.stable.fingerprint != history[0].stable.fingerprint and final.candidate is None
            # One candidate replica on each agent, and the route sends to both.
            placed = {agent: [r for r in WorkerClient(agent, token).replicas()
                              if r["revision"] == final.stable.fingerprint and r["state"] == "ready"]
                      for agent in (parts.worker_url, second_agent)}
            assert all(len(replicas) == 1 for replicas in placed.values()), placed
            endpoints = {str(r["endpoint"]).rstrip("/") for replicas in placed.values() for r in replicas}
            assert {url.rstrip("/") for url in final.stable.endpoints} == endpoints
            # Both routers serve the last generation and answer with the promoted revision.
            for public, admin in ((url_a, admin_a), (url_b, admin_b)):
                assert generation_served(admin, token) == final.generation
                answer = httpx.post(f"{public}/v1/completions", timeout=60,
                                    json={"model": ROUTE, "prompt": "add 1+2=", "max_tokens": 4})
                assert answer.status_code == 200
                assert answer.headers["x-revgate-revision"] == final.stable.fingerprint

    # Every generation the flow wrote was served by both routers before the flow went on.
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(f"revgate/{ROUTE}")
    assert experiment is not None
    run = client.search_runs([experiment.experiment_id])[0]
    synced = sorted(a.path for a in client.list_artifacts(run.info.run_id, "evidence")
                    if a.path.startswith("evidence/routers-generation-"))
    generations = {int(path.removesuffix(".json").rsplit("-", 1)[1]): path for path in synced}
    canary = next(s.generation for s in history if s.candidate is not None)
    assert {canary, final.generation} <= set(generations), (synced, [s.generation for s in history])
    for generation, path in generations.items():
        served = json.loads(Path(client.download_artifacts(run.info.run_id, path, str(tmp_path))).read_text())
        assert set(served["served"]) == {admin_a.rstrip("/"), admin_b.rstrip("/")}
        assert all(seen is not None and seen >= generation for seen in served["served"].values()), served
