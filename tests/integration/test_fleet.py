"""A rollout beyond one host, asked for as the Prefect UI's Run button asks: two worker agents, two
routers sharing a route store on an S3 server, and a run of the ``promote-revision`` deployment.

Real parts throughout: a Prefect server with the ``revgate`` process work pool and a ``prefect
worker`` process, worker agents with vLLM on the CPU, `revgate router` processes reading the route
from moto's S3 server. The site configuration names the whole fleet (both agents, both routers, the
S3 route store) and a plan asking for two candidate replicas; ``revgate promote fleet improved``
submits the deployment's run through the Prefect API and the worker runs it. One candidate replica
lands on each agent, the route lists both, a step counts as applied only once both routers serve its
generation, and ``revgate status`` shows the generation of each router and the replicas of each agent.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from mlflow.tracking import MlflowClient

from revgate.flows import processes
from revgate.flows.demo import EXECUTION, demo_policy
from revgate.flows.spec import PromotionSpec
from revgate.manifests.rollout import Bake, RolloutPlan, SetWeight
from revgate.manifests.route import RouteSnapshot
from revgate.registry.route_store import open_route_store
from revgate.serving.worker.client import WorkerClient
from tests.integration.rollout_estate import WARM, estate, write_site
from tests.integration.test_deployments import ROOT, deployed, revgate_env

pytestmark = [pytest.mark.engine, pytest.mark.servers]

ROUTE = "fleet"
SUBMITTED = re.compile(r"\(([0-9a-f-]{36})\) submitted to promote/promote-revision")
RUN_S = 1200  # the whole rollout on a busy two-core host: two candidate replicas load and warm on vLLM-CPU


def routes_on_s3(endpoint: str) -> str:
    """A fresh bucket's route-store URL on the S3 server."""
    bucket = f"routes-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/routes?endpoint_url={endpoint}"


def generation_served(admin_url: str, token: str) -> int:
    """The generation a router serves, from its admin health."""
    health = httpx.get(f"{admin_url}/admin/health", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    return int(health.json()["generation"])


def promote_from_deployment(env: dict[str, str], folder: Path) -> tuple[str, str]:
    """``revgate promote fleet improved``: a run of the deployment, followed to its end; its id and output."""
    output = folder / "promote.out"
    with output.open("w") as sink:
        command = subprocess.Popen([sys.executable, "-m", "revgate.cli.main", "promote", ROUTE, "improved",
                                    "--requested-by", "ana"], cwd=ROOT, env=env, stdout=sink,
                                   stderr=subprocess.STDOUT, text=True)
        try:
            code = command.wait(RUN_S)
        except subprocess.TimeoutExpired:
            command.kill()
            command.wait(30)
            code = None
    printed = output.read_text(errors="replace")
    worker_log = (folder / "worker.log").read_text(errors="replace") if (folder / "worker.log").exists() else ""
    assert code == 0 and printed.rstrip().endswith("decision: promoted"), (
        f"exit {code} (None: still running after {RUN_S} s)\n{printed[-4000:]}\nworker:\n{worker_log[-4000:]}")
    submitted = SUBMITTED.search(printed)
    assert submitted, printed[-2000:]
    return submitted.group(1), printed


def status_json(routes: str, *, routers: list[str], agents: list[str], token: Path, tracking: str,
                prefect_api: str) -> tuple[int, dict[str, Any]]:
    """``revgate status fleet --json`` over both routers and both agents: its exit code and document."""
    argv = [sys.executable, "-m", "revgate.cli.main",
            "status", ROUTE, "--routes", routes, "--router-token-file", str(token),
            "--worker-token-file", str(token), "--tracking-uri", tracking, "--prefect-api", prefect_api, "--json",
            "--timeout", "10"]
    argv += [arg for url in routers for arg in ("--router", url)] + [arg for url in agents for arg in ("--worker", url)]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=180)
    assert result.stdout.strip(), result.stderr[-3000:]
    return result.returncode, json.loads(result.stdout)


@pytest.mark.timeout(RUN_S + 900)
def test_a_deployment_run_puts_the_candidate_on_every_agent_and_every_router_serves_each_generation(
    zoo_dir: Path, prefect_api: str, s3_endpoint: str, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client

    with estate(zoo_dir, prefect_api, tmp_path / "estate") as parts, \
            processes.worker_agent(tmp_path / "second-agent", parts.token) as second_agent:
        routes = routes_on_s3(s3_endpoint)
        open_route_store(routes).write(RouteSnapshot(route=ROUTE, generation=1, stable=parts.stable(),
                                                     created_by="seed", created_at=datetime.now(UTC),
                                                     reveal_revision=True))
        token = parts.token.read_text().strip()
        agents = [parts.worker_url, second_agent]
        sink = str(tmp_path / "records")  # both routers write here: the flow's one evidence source
        with processes.router(routes, ROUTE, tmp_path / "router-a", parts.token, sink=sink, router_id="router-a") \
                as (url_a, admin_a), \
                processes.router(routes, ROUTE, tmp_path / "router-b", parts.token, sink=sink,
                                 router_id="router-b") as (url_b, admin_b):
            plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Bake(seconds=2)], lease_seconds=60,
                                     rollback_window_seconds=0, candidate_replicas=2)
            tracking = f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
            spec = PromotionSpec(
                route=ROUTE, candidate_manifest=parts.digests["improved"], candidate_name="improved",
                artifact_store=parts.store, route_store=routes, signature=parts.policy, execution=EXECUTION,
                warm=WARM, gate_policy=demo_policy(), plan=plan, worker_url=parts.worker_url,
                more_workers=(second_agent,), worker_token_file=str(parts.token), router_url=url_a,
                router_admin_url=admin_a, more_routers=(admin_b,), router_sync_s=60,
                router_admin_token_file=str(parts.token),
                records_sink=sink, trace=str(tmp_path / "trace.jsonl"),
                tracking_uri=tracking, evidence_root=str(tmp_path / "evidence"), approval="auto",
            )
            # The site configuration names the fleet; the Run form's fields name the route and the candidate.
            env = revgate_env(prefect_api, write_site(tmp_path / "site.json", [spec]))
            with deployed(env, tmp_path):
                flow_run_id, printed = promote_from_deployment(env, tmp_path)
            print(printed)
            assert "routers" in printed and "replica(s)" in printed  # the live view while following

            history = list(open_route_store(routes).history(ROUTE))
            final = history[-1]
            assert final.stable.fingerprint != history[0].stable.fingerprint and final.candidate is None
            assert final.created_by.startswith("ana (claimed; prefect flow run "), final.created_by
            # One candidate replica on each agent, and the route sends to both.
            placed = {agent: [r for r in WorkerClient(agent, token).replicas()
                              if r["revision"] == final.stable.fingerprint and r["state"] == "ready"]
                      for agent in agents}
            assert all(len(replicas) == 1 for replicas in placed.values()), placed
            endpoints = {str(r["endpoint"]).rstrip("/") for replicas in placed.values() for r in replicas}
            assert {url.rstrip("/") for url in final.stable.endpoints} == endpoints
            # Each candidate endpoint named its agent's host as its failure domain while it served (one host here).
            canary = next(s for s in history if s.candidate is not None)
            assert canary.failure_domains == dict.fromkeys(canary.candidate.endpoints, "127.0.0.1")  # type: ignore[union-attr]
            assert final.failure_domains == dict.fromkeys(final.stable.endpoints, "127.0.0.1")
            # Both routers serve the last generation and answer with the promoted revision.
            for public, admin in ((url_a, admin_a), (url_b, admin_b)):
                assert generation_served(admin, token) == final.generation
                answer = httpx.post(f"{public}/v1/completions", timeout=60,
                                    json={"model": ROUTE, "prompt": "add 1+2=", "max_tokens": 4})
                assert answer.status_code == 200
                assert answer.headers["x-revgate-revision"] == final.stable.fingerprint

            # revgate status: each router on the final generation, each agent with its ready replica.
            code, status = status_json(routes, routers=[admin_a, admin_b], agents=agents, token=parts.token,
                                       tracking=tracking, prefect_api=prefect_api)
            assert code == 0 and status["problems"] == [], status
            assert status["generation"] == final.generation and status["stage"] == "stable"
            assert {r["url"].rstrip("/"): (r["generation"], r["status"]) for r in status["routers"]} == {
                admin_a.rstrip("/"): (final.generation, "ok"), admin_b.rstrip("/"): (final.generation, "ok")}
            ready = {w["url"].rstrip("/"): [p["endpoint"].rstrip("/") for p in w["replicas"]
                                            if p["revision"] == final.stable.fingerprint and p["state"] == "ready"]
                     for w in status["workers"] if w["reachable"]}
            assert ready == {agent.rstrip("/"): [r["endpoint"].rstrip("/") for r in placed[agent]]
                             for agent in agents}, status["workers"]
            assert status["links"]["flow_run_id"] == flow_run_id and status["links"]["prefect"] == "Completed"
            assert status["links"]["decision"] == "promoted"

    # The deployment's run is the one the worker ran, and the evidence run is its.
    with get_client(sync_client=True) as prefect:
        run = prefect.read_flow_run(uuid.UUID(flow_run_id))
        deployment = prefect.read_deployment_by_name("promote/promote-revision")
    assert run.deployment_id == deployment.id and run.parameters["route"] == ROUTE
    assert run.state is not None and run.state.is_completed() and run.state.message == "decision: promoted"
    # Every generation the flow wrote was served by both routers before the flow went on.
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(f"revgate/{ROUTE}")
    assert experiment is not None
    evidence_run = client.search_runs([experiment.experiment_id])[0]
    assert evidence_run.data.tags["prefect_flow_run_id"] == flow_run_id
    listed = [a.path for a in client.list_artifacts(evidence_run.info.run_id, "evidence")]

    def generations(prefix: str) -> dict[int, str]:
        return {int(path.removesuffix(".json").rsplit("-", 1)[1]): path for path in listed
                if path.startswith(f"evidence/{prefix}")}

    written, synced = generations("route-generation-"), generations("routers-generation-")
    canary = next(s.generation for s in history if s.candidate is not None)
    assert {canary, final.generation} <= set(written), (listed, [s.generation for s in history])
    assert set(synced) == set(written), listed
    for generation, path in synced.items():
        served = json.loads(Path(client.download_artifacts(evidence_run.info.run_id, path, str(tmp_path))).read_text())
        assert set(served["served"]) == {admin_a.rstrip("/"), admin_b.rstrip("/")}
        assert all(seen is not None and seen >= generation for seen in served["served"].values()), served
    # Each candidate replica has its own record in the evidence, one per agent; the load step counts both.
    replicas = [json.loads(Path(client.download_artifacts(evidence_run.info.run_id, path, str(tmp_path))).read_text())
                for path in sorted(listed) if path.startswith("evidence/replica-")]
    assert sorted(r["worker_url"].rstrip("/") for r in replicas) == sorted(a.rstrip("/") for a in agents), replicas
    assert evidence_run.data.metrics["load.replicas"] == 2
