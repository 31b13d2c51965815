"""``revgate status`` through real parts: a file route store, a router process, a worker agent and
MLflow on SQLite; Prefect and MLflow servers that are down show as unreachable."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from revgate.evaluation.gates import gates_from_policy, judge
from revgate.flows.report import report_markdown
from revgate.registry.ledger import EvidenceLedger, sqlite_uri
from revgate.serving.worker.engine import free_port
from tests.conftest import ROOT, wait_for_port
from tests.integration.commands import revgate
from tests.integration.router_harness import RouterProcess, UpstreamFarm, fingerprint, router_process, snapshot
from tests.unit.test_gates import evidence, policy

pytestmark = pytest.mark.servers

FLOW_RUN = "0b7e3c1e-5f0a-4d7e-9a61-2f4f1c9d8e01"
CHAT = partial(snapshot, "chat")  # the next generation of route chat
EVEN = {"add": 0.8, "rev": 0.8, "sort": 0.8}


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A worker agent with no replicas yet, and its token file."""
    token = tmp_path / "worker-token"
    token.write_text(secrets.token_hex(16))
    token.chmod(0o600)
    port = free_port()
    command = [sys.executable, "-m", "revgate.cli.main",
               "worker", "--port", str(port), "--cache", str(tmp_path / "cache"),
               "--token-file", str(token)]
    with (tmp_path / "worker.log").open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            wait_for_port(port, 60, process)
            yield f"http://127.0.0.1:{port}", token
        finally:
            process.terminate()
            process.wait(15)


def status(router: RouterProcess, tmp_path: Path, worker: tuple[str, Path], *extra: str) -> tuple[int, dict[str, Any]]:
    """``revgate status chat --json`` against the test's parts; its exit code and document."""
    result = revgate("status", "chat", "--routes", str(tmp_path / "routes"), "--router", router.admin_url,
                     "--router-token-file", str(tmp_path / "token"), "--worker", worker[0],
                     "--worker-token-file", str(worker[1]), "--tracking-uri", sqlite_uri(tmp_path / "mlflow.db"),
                     "--mlflow-ui", "http://mlflow.example", "--prefect-api", f"http://127.0.0.1:{free_port()}/api",
                     "--json", *extra)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def log_gate_report(tmp_path: Path) -> str:
    """The rollout's evidence run with one gate report, as the flow logs it; its run id."""
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    run = ledger.open_run("chat", fingerprint("cand"), {"prefect_flow_run_id": FLOW_RUN})
    gate_policy = policy()
    report = judge(gates_from_policy(gate_policy), gate_policy, evidence(EVEN, EVEN, n=300))
    ledger.log_gate_report(run, "gate-report-01-step01", report, report_markdown(report, "step01"), 1)
    return run.run_id


def test_status_json_before_during_and_after_a_route_change(tmp_path: Path, worker: tuple[str, Path]) -> None:
    with UpstreamFarm(["stable0", "cand0"]) as farm, \
            router_process(tmp_path, "chat", snapshot("chat", 1, [farm["stable0"]]), poll_interval=60) as router:
        code, before = status(router, tmp_path, worker)
        assert code == 0, before
        assert before["schema"] == "revgate/status/v1" and before["exit_code"] == 0
        assert (before["stage"], before["generation"], before["candidate"]) == ("stable", 1, None)
        assert before["stable"]["ppm"] == 1_000_000 and before["stable"]["fingerprint"] == fingerprint("stable")
        assert [(r["url"], r["generation"], r["status"]) for r in before["routers"]] == [(router.admin_url, 1, "ok")]
        assert before["workers"] == [{"url": worker[0], "reachable": True, "replicas": [], "detail": ""}]
        assert before["links"]["mlflow"] == "none" and before["problems"] == []

        # During: a candidate at a quarter of the traffic, with the rollout's first gate report.
        router.commit(CHAT, stable=[farm["stable0"]], candidate=[farm["cand0"]], weight_ppm=250_000)
        run_id = log_gate_report(tmp_path)
        code, during = status(router, tmp_path, worker)
        assert code == 1, during
        assert (during["stage"], during["generation"]) == ("canary", 2)
        assert (during["stable"]["ppm"], during["candidate"]["ppm"]) == (750_000, 250_000)
        assert during["candidate"]["endpoints"] == [farm["cand0"].url]
        assert during["routers"][0]["generation"] == 2
        links = during["links"]
        assert (links["mlflow"], links["run_id"], links["flow_run_id"]) == ("found", run_id, FLOW_RUN)
        assert links["run_url"].startswith("http://mlflow.example/#/experiments/") and run_id in links["run_url"]
        assert links["prefect"] == "unreachable"  # no Prefect server on that port
        gates = links["gates"]
        assert gates["report"] == "gate-report-01-step01" and gates["candidate_requests"] == 300
        quality = [s for s in gates["slices"] if s["gate"] == "quality"]
        assert {(s["slice"], s["stable_samples"], s["candidate_samples"]) for s in quality} == {
            ("family=add", 100, 100), ("family=rev", 100, 100), ("family=sort", 100, 100)}

        # A router that has not caught up with the store is degraded until it does.
        router.store.write(snapshot("chat", 3, [farm["stable0"]], candidate=[farm["cand0"]], weight_ppm=500_000))
        code, behind = status(router, tmp_path, worker)
        assert code == 2 and behind["routers"][0]["status"] == "behind", behind
        assert behind["problems"] == [f"router {router.admin_url}: behind: serves generation 2, the store holds 3"]
        router.notify()
        assert status(router, tmp_path, worker)[0] == 1

        # After: the candidate is the stable revision alone.
        router.commit(CHAT, stable=[farm["cand0"]])
        code, after = status(router, tmp_path, worker)
        assert code == 0, after
        assert (after["stage"], after["generation"], after["candidate"]) == ("stable", 4, None)
        assert after["stable"]["fingerprint"] == fingerprint("cand")


def test_unreachable_parts_degrade_or_say_unreachable_and_bad_input_exits_3(
    tmp_path: Path, worker: tuple[str, Path]
) -> None:
    with UpstreamFarm(["stable0"]) as farm, \
            router_process(tmp_path, "chat", snapshot("chat", 1, [farm["stable0"]])) as router:
        dead = f"http://127.0.0.1:{free_port()}"
        result = revgate("status", "chat", "--routes", str(tmp_path / "routes"), "--router", router.admin_url,
                         "--router", dead, "--router-token-file", str(tmp_path / "token"),
                         "--tracking-uri", dead, "--json")
        document = json.loads(result.stdout)
        assert result.returncode == 2, document
        assert [r["status"] for r in document["routers"]] == ["ok", "unreachable"]
        assert document["links"]["mlflow"] == "unreachable"

        missing = revgate("status", "other", "--routes", str(tmp_path / "routes"))
        assert missing.returncode == 3 and "RouteNotFound: route 'other' has no snapshot" in missing.stderr
        bad = revgate("status", "chat", "--routes", str(tmp_path / "routes"), "--timeout", "soon")
        assert bad.returncode == 3 and "invalid float value: 'soon'" in bad.stderr
        wrong_token = revgate("status", "chat", "--routes", str(tmp_path / "routes"), "--router", router.admin_url)
        assert wrong_token.returncode == 2 and "unreachable" in wrong_token.stdout  # 401 without the token
        assert worker  # the fixture's agent is up: only the router's answer differs


def test_plain_output_and_watch(tmp_path: Path, worker: tuple[str, Path]) -> None:
    with UpstreamFarm(["stable0", "cand0"]) as farm, \
            router_process(tmp_path, "chat", snapshot("chat", 1, [farm["stable0"]], candidate=[farm["cand0"]],
                                                      weight_ppm=50_000)) as router:
        args = ["status", "chat", "--routes", str(tmp_path / "routes"), "--router", router.admin_url,
                "--router-token-file", str(tmp_path / "token"), "--worker", worker[0],
                "--worker-token-file", str(worker[1])]
        result = revgate(*args)
        assert result.returncode == 1, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "route chat  generation 1  stage canary"
        assert lines[1].startswith(f"  stable    {fingerprint('stable')[:19]}        95%  {farm['stable0'].url}")
        assert lines[2].startswith(f"  candidate {fingerprint('cand')[:19]}         5%  {farm['cand0'].url}")
        assert f"  {router.admin_url}  generation 1  ok" in lines
        assert f"  {worker[0]}  0 replica(s)" in lines
        assert "mlflow run  not configured" in lines and "gates       not configured" in lines
        watched = revgate(*args, "--json", "--watch", "0.05", "--rounds", "2")
        views = [json.loads(line) for line in watched.stdout.splitlines()]
        assert watched.returncode == 1 and [v["generation"] for v in views] == [1, 1]
