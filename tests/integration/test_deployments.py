"""Rollouts as Prefect deployment runs, through the real parts: a Prefect server, the ``revgate`` process
work pool, the deployments applied from prefect.yaml by ``revgate deploy``, a ``prefect worker``
process, and runs asked for by name with ``revgate promote ROUTE CANDIDATE`` (the API call the UI's
Run button makes). These rollouts end early in well-defined ways, so no engine is needed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import pytest

from revgate.flows import processes
from revgate.manifests.gates import GatePolicy
from revgate.manifests.rollout import Approve, RolloutPlan, SetWeight
from revgate.manifests.route import CanaryTarget, RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import successor
from revgate.registry.build import build_manifest
from revgate.registry.route_store import open_route_store
from revgate.registry.store import open_store
from tests.integration.rollout_estate import wait_until

pytestmark = pytest.mark.servers

ROOT = Path(__file__).resolve().parents[2]
MISSING = "sha256:" + "9" * 64
STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:9",))


@dataclass
class Site:
    """A site configuration with two routes, its stores, and the environment that reaches the Prefect server."""

    root: Path
    path: Path
    env: dict[str, str]
    candidate: str  # a manifest digest that is in the artifact store

    def revgate(self, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
        """A ``revgate`` command as a person runs it."""
        return subprocess.run([sys.executable, "-m", "revgate.cli.main",
                               *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, check=False, timeout=timeout_s)

    def promote(self, *args: str) -> subprocess.Popen[str]:
        """``revgate promote ...`` started in the background."""
        return subprocess.Popen([sys.executable, "-m", "revgate.cli.main", "promote", *args], cwd=ROOT, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def write_site(root: Path) -> tuple[Path, str]:
    """Routes ``alpha`` and ``beta`` on one stable revision; a tiny published candidate; one policy and plan."""
    model = root / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"note": "a tiny artifact"}', encoding="utf-8")
    store = str(root / "artifacts")
    candidate = open_store(store).push(model, build_manifest(model))
    routes = open_route_store(str(root / "routes"))
    token = processes.token_file(root / "token")
    settings = {
        "artifact_store": store, "route_store": str(root / "routes"),
        "signature": {"kind": "key", "public_key": str(root / "publisher.pub")},
        "worker_url": "http://127.0.0.1:9", "worker_token_file": str(token), "router_url": "http://127.0.0.1:9",
        "router_admin_url": "http://127.0.0.1:9", "router_admin_token_file": str(token),
        "records_sink": str(root / "records"), "trace": str(root / "trace.jsonl"),
        "tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "evidence_root": str(root / "evidence"),
        "policy": "default", "plan": "half", "candidates": {"tiny": candidate}, "approval": "auto",
    }
    for route in ("alpha", "beta"):
        routes.write(RouteSnapshot(route=route, generation=1, stable=STABLE, created_by="seed",
                                   created_at=datetime.now(UTC)))
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)], lease_seconds=20)
    gated = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Approve()], lease_seconds=20, approvers=("rm",))
    document = {"routes": {"alpha": settings, "beta": settings},
                "policies": {"default": GatePolicy().model_dump(mode="json")},
                "plans": {"half": plan.model_dump(mode="json"), "gated": gated.model_dump(mode="json")}}
    path = root / "site.json"
    path.write_text(json.dumps(document, indent=1), encoding="utf-8")
    return path, candidate


def revgate_env(prefect_api: str, site: Path) -> dict[str, str]:
    """The environment of a person's shell and of the worker: the Prefect server, the checkout, the site file."""
    return {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_WORKER_QUERY_SECONDS": "1",
            "REVGATE_HOME": str(ROOT), "REVGATE_SITE": str(site), "PREFECT_LOGGING_LEVEL": "INFO"}


@contextmanager
def deployed(env: dict[str, str], folder: Path) -> Iterator[None]:
    """``revgate deploy`` (work pool and the package's deployments), then a ``prefect worker`` on the pool."""
    done = subprocess.run([sys.executable, "-m", "revgate.cli.main", "deploy"], cwd=folder, env=env,
                          capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "work pool revgate" in done.stdout
    argv = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "revgate"]
    with (folder / "worker.log").open("ab") as log:
        worker = subprocess.Popen(argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        processes.stop(worker)


@pytest.fixture(scope="module")
def site(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """The deployments applied with ``revgate deploy`` and one worker polling the pool every second."""
    root = tmp_path_factory.mktemp("site")
    path, candidate = write_site(root)
    env = revgate_env(prefect_api, path)
    with deployed(env, root):
        yield Site(root, path, env, candidate)


def test_the_run_form_is_typed_and_described(site: Site) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        promote = client.read_deployment_by_name("promote/promote-revision")
        rollback = client.read_deployment_by_name("rollback/rollback-route")
    form = promote.parameter_openapi_schema or {}
    fields = form["properties"]
    assert set(form["required"]) == {"route", "candidate"}
    assert list(fields) == ["route", "candidate", "policy", "plan", "requested_by"]  # no approval mode: the site's
    for name in fields:
        assert fields[name]["type"] == "string" and fields[name]["description"], name
    assert "sha256:" in fields["candidate"]["description"]
    assert promote.work_pool_name == rollback.work_pool_name == "revgate"
    assert (rollback.parameter_openapi_schema or {})["required"] == ["route"]


def run_span(output: str) -> tuple[datetime, datetime]:
    """When the worker started the process of the run whose id ``revgate promote`` printed, and when it ended."""
    from prefect.client.orchestration import get_client

    run_id = re.search(r"flow run \S+ \(([0-9a-f-]{36})\) submitted", output)
    assert run_id is not None, output
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(run_id.group(1)))
        started = [state.timestamp for state in client.read_flow_run_states(run.id) if state.type.value == "PENDING"]
    assert started and run.end_time is not None
    return started[0], run.end_time


@pytest.mark.timeout(300)
def test_a_refused_route_and_a_missing_candidate_each_end_with_their_reason(site: Site) -> None:
    """Two submissions at once on one worker: the locked route is refused, the other route fails on its digest."""
    from prefect.concurrency.sync import concurrency

    from revgate.flows.route_lock import ensure_route_lock, lock_name

    ensure_route_lock("alpha")
    with concurrency(lock_name("alpha"), occupy=1, strict=True):  # another rollout holds alpha
        locked = site.promote("alpha", "tiny")
        missing = site.promote("beta", MISSING, "--policy", "default", "--plan", "half")
        locked_out, _ = locked.communicate(timeout=240)
        missing_out, _ = missing.communicate(timeout=240)
    print(locked_out, missing_out, sep="\n")
    assert locked.returncode == 4, locked_out
    # Taken by the worker and refused by the flow itself, at once (Prefect's 423): the live view may see it end
    # before it polls "Running".
    assert "submitted to promote/promote-revision" in locked_out and "Submitting" in locked_out
    assert "refused: route 'alpha' already has a rollout in progress" in locked_out
    assert missing.returncode == 5, missing_out
    assert f"candidate {MISSING} is not in the artifact store" in missing_out
    (first, first_end), (second, second_end) = run_span(locked_out), run_span(missing_out)
    assert first < second_end and second < first_end  # the worker ran both processes at the same time
    for route in ("alpha", "beta"):
        assert [s.generation for s in open_route_store(str(site.root / "routes")).history(route)] == [1]
    assert not (site.root / "mlflow.db").exists()  # both ended before an evidence run was opened


@pytest.mark.timeout(300)
def test_an_unknown_name_names_what_the_site_has(site: Site) -> None:
    done = site.revgate("promote", "alpha", "tiny", "--plan", "fast")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "no rollout plan named 'fast'" in done.stdout and "half" in done.stdout


@pytest.mark.timeout(300)
def test_a_run_cannot_skip_the_approvals_of_a_plan_that_names_approvers(site: Site) -> None:
    # The route approves automatically; the plan chosen on the form names a release manager.
    done = site.revgate("promote", "beta", "tiny", "--plan", "gated")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "approval 'auto' is refused for a rollout plan that names approvers" in done.stdout, done.stdout
    assert [s.generation for s in open_route_store(str(site.root / "routes")).history("beta")] == [1]


@pytest.mark.timeout(300)
def test_the_rollback_deployment_removes_the_canary(site: Site) -> None:
    routes = open_route_store(str(site.root / "routes"))
    current = routes.read("beta")
    assert current is not None
    now = datetime.now(UTC)
    canary = CanaryTarget(fingerprint="sha256:" + "3" * 64, endpoints=("http://127.0.0.1:10",), weight_ppm=50_000,
                          lease_expires_at=now + timedelta(minutes=10))
    routes.write(successor(current, by="a rollout", now=now, candidate=canary))
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "deployment", "run", "rollback/rollback-route", "--param", "route=beta",
         "--param", "requested_by=oncall", "--watch"],
        cwd=ROOT, env=site.env, capture_output=True, text=True, check=False, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    after = wait_until(lambda: routes.read("beta"), 5, "the route")
    assert after.candidate is None and after.stable.fingerprint == STABLE.fingerprint
    assert after.created_by.startswith("oncall (claimed; prefect flow run ") and after.created_by.endswith(
        ") (rollback)"), after.created_by


@pytest.mark.timeout(300)
def test_a_local_run_reads_the_site_given_and_no_deployment_is_named_clearly(site: Site) -> None:
    env = {key: value for key, value in site.env.items() if key != "REVGATE_SITE"}
    local = subprocess.run([sys.executable, "-m", "revgate.cli.main", "promote", "beta", MISSING, "--local", "--site",
                            str(site.path)],
                           cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=240)
    assert local.returncode == 5, local.stdout + local.stderr
    assert f"candidate {MISSING} is not in the artifact store" in local.stdout
    unreachable = subprocess.run([sys.executable, "-m", "revgate.cli.main", "promote", "beta", "tiny"], cwd=ROOT,
                                 env={**env, "PREFECT_API_URL": "http://127.0.0.1:9/api"}, capture_output=True,
                                 text=True, check=False, timeout=240)
    assert unreachable.returncode == 2
    assert "the Prefect API cannot be reached" in unreachable.stderr
