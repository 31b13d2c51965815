"""`revgate demo` as a user types it, end to end on the embedded default: real Prefect, worker, vLLM,
router, MLflow. `improved` must go through shadow, approval and canary to promotion, with the MLflow
alias moved to it, and the demo must stay up for its tour; a SIGTERM mid-rollout must stop everything
it started. The other candidates' decisions are in test_demo_rollouts.py, on one shared demo session.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from mlflow.tracking import MlflowClient

from revgate.registry.route_store import open_route_store
from tests.integration.gate_reports import evidence_counts, last_report
from tests.integration.rollout_estate import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.servers]


def demo_command(zoo_dir: Path, state: Path, candidate: str, *more: str) -> list[str]:
    """``revgate demo`` as a user types it."""
    return [sys.executable, "-m", "revgate.cli.main", "demo", "--state", str(state), "--zoo", str(zoo_dir),
            "--candidate", candidate, *more]


def stays_up(zoo_dir: Path, state: Path) -> tuple[str, dict[str, str]]:
    """``revgate demo`` left running after its decision: its output up to the tour, and the tour's URLs.

    Checks what the tour points at while it is up, then stops the demo with Ctrl-C (SIGINT).
    """
    process = subprocess.Popen(demo_command(zoo_dir, state, "improved"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert process.stdout is not None
    lines: list[str] = []
    watchdog = threading.Timer(1500, kill_all, (process,))  # a demo that never reaches its tour ends the read below
    watchdog.start()
    try:
        for line in process.stdout:  # the demo ends its output with the tour, then waits
            lines.append(line)
            if "revgate status demo" in line:
                break
        output = "".join(lines)
        assert "The demo stays up; Ctrl-C stops everything." in output, output[-3000:]
        urls = {name: re.search(pattern, output).group(1)  # type: ignore[union-attr]
                for name, pattern in (("prefect", r"Prefect UI: (\S+)"), ("run", r"the rollout's run: (\S+)"),
                                      ("mlflow", r"MLflow UI: (http://[^/\s]+)"), ("router", r"the router: (\S+)/v1"))}
        auth = (state / "prefect-auth").read_text().strip().split(":", 1)
        assert httpx.get(f"{urls['prefect']}/api/health", auth=(auth[0], auth[1]), timeout=30).status_code == 200
        assert "/runs/flow-run/" in urls["run"]
        model = httpx.get(f"{urls['mlflow']}/api/2.0/mlflow/registered-models/get", params={"name": "demo"},
                          timeout=30)
        assert model.status_code == 200 and model.json()["registered_model"]["aliases"], model.text
        answer = httpx.post(f"{urls['router']}/v1/completions", json={"model": "demo", "prompt": "add 1+2=",
                                                                         "max_tokens": 4}, timeout=60)
        assert answer.status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(120) == 0
        for url in (urls["prefect"], urls["mlflow"], urls["router"]):
            with pytest.raises(httpx.HTTPError):
                httpx.get(url, timeout=5)
    finally:
        watchdog.cancel()
        kill_all(process)
    return output, urls


def kill_all(process: subprocess.Popen[str]) -> None:
    """Kill a demo still running and every process it started (its session), so none outlives the test."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def test_an_improved_revision_is_promoted_through_every_stage_and_the_demo_stays_up(
    zoo_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "demo"
    output, _ = stays_up(zoo_dir, state)
    assert "decision: promoted" in output
    history = open_route_store(str(state / "routes")).history("demo")
    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    first, last = history[0], history[-1]
    assert any(s.shadow is not None for s in history) and any(s.candidate is not None for s in history)
    assert last.stable.fingerprint != first.stable.fingerprint and last.candidate is None
    alias = client.get_model_version_by_alias("demo", "stable")
    assert alias.tags["revgate.fingerprint"] == last.stable.fingerprint
    run = client.get_run(alias.run_id)  # the version's source run holds the promotion's evidence
    assert run.data.tags["revgate.decision"] == "promoted"
    assert {"revgate.step.verify", "revgate.step.isolated-check"} <= set(run.data.tags)
    assert sum(key.startswith("revgate.digest.gate-report-") for key in run.data.tags) >= 2  # shadow and canary
    _, report = last_report(client, tmp_path)
    counts = evidence_counts(report)  # the canary's evidence: users' requests and probes, on both arms
    assert min(counts.values()) > 0, counts


def started_by(state: Path) -> list[int]:
    """Processes whose command line or environment names the demo's state folder (the Prefect server's
    PREFECT_HOME is in it), this test's own process aside."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            named = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if str(state).encode() in named:
            found.append(int(entry.name))
    return found


def test_a_sigterm_mid_rollout_stops_every_process_the_demo_started(zoo_dir: Path, tmp_path: Path) -> None:
    # The defect: SIGTERM outside the demo's last stage ended it at once (the default action), and its
    # Prefect server, worker agent, engines, router, users' traffic and promotion ran on with no parent.
    state = tmp_path / "demo"
    process = subprocess.Popen(demo_command(zoo_dir, state, "improved", "--exit"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert process.stdout is not None
    watchdog = threading.Timer(900, kill_all, (process,))
    watchdog.start()
    lines: list[str] = []
    try:
        for line in process.stdout:  # until the rollout has started its candidate's replica
            lines.append(line)
            if "start-candidate" in line and "Finished" in line:
                break
        output = "".join(lines)
        prefect = re.search(r"Prefect server at (http://\S+),", output)
        assert prefect is not None and "start-candidate" in output, output[-3000:]
        process.send_signal(signal.SIGTERM)  # to the demo alone, as a service manager sends it
        rest = process.communicate(timeout=180)[0]
        assert process.returncode == 130, rest[-3000:]
        assert "interrupted; every process it started is stopped" in rest
    finally:
        watchdog.cancel()
        kill_all(process)

    try:  # stopping a child may take its grace period: polled, with a deadline
        wait_until(lambda: not started_by(state), 60, "every process the demo started ended")
    finally:
        for pid in started_by(state):  # a failing run leaves nothing behind either
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{prefect.group(1)}/api/health", timeout=5)
