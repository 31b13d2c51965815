"""`revgate demo` as a user types it, end to end on the embedded default: real Prefect, worker, vLLM,
router, MLflow. `improved` must go through shadow, approval and canary to promotion, with the MLflow
alias moved to it, and the demo must stay up for its tour; a SIGTERM in its shadow stage, its approval
pause or its tour after the decision must stop every process it started. The other candidates'
decisions are in test_demo_rollouts.py, on one shared demo session.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mlflow.tracking import MlflowClient

from revgate.registry.route_store import open_route_store
from tests.integration.browser import answer_the_resume_form, browser_page, screenshot
from tests.integration.gate_reports import evidence_counts, last_report
from tests.integration.rollout_estate import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.servers, pytest.mark.gated]


def demo_command(zoo_dir: Path, state: Path, candidate: str, *more: str) -> list[str]:
    """``revgate demo`` as a user types it."""
    return [sys.executable, "-m", "revgate.cli.main", "demo", "--state", str(state), "--zoo", str(zoo_dir),
            "--candidate", candidate, *more]


APPROVER = "alice@example.com"
PREFECT = re.compile(r"Prefect server at (\S+), behind basic auth: the UI asks for the user:password in (\S+)")
RUN_PAGE = re.compile(r"View at (\S+/runs/flow-run/[0-9a-f-]+)")  # the flow's first log line
PAUSED = re.compile(r"Pausing flow, execution will continue when this flow run is resumed")
TOUR = re.compile(r"revgate status demo")  # the tour's last line: the demo has decided and stays up
REPORT = "Gates at stage"  # the heading of a gate report's markdown (flows/report.py)
EVIDENCE = re.compile(r"evidence digest (sha256:[0-9a-f]{64})")


class Output:
    """A running process's output, read on a thread of its own, kept whole and matched line by line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.ended = False  # the process closed its output
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)
        self.ended = True

    def wait_for(self, pattern: re.Pattern[str], deadline: float, what: str) -> re.Match[str]:
        """The first line from here on that matches; fails at the deadline or when the output ends first."""
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"the demo stopped before {what}:\n{''.join(self.lines)[-3000:]}")
            if found := pattern.search(line):
                return found
        pytest.fail(f"no {what} in time:\n{''.join(self.lines)[-3000:]}")


SCROLLED = "document.querySelectorAll('.p-modal, .p-modal *:not(textarea)')"


def show_the_whole_form(page: Any) -> None:
    """A viewport tall enough for the whole form, scrolled to its top: the report, then every field."""
    hidden = page.evaluate(f"() => Math.max(0, ...Array.from({SCROLLED}, e => e.scrollHeight - e.clientHeight))")
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": min(size["height"] + int(hidden) + 40, 4000)})
    page.evaluate(f"() => {SCROLLED}.forEach(e => {{ e.scrollTop = 0; }})")


def approve_on_the_resume_form(page: Any, run_page: str, auth: str, approver: str, folder: Path) -> tuple[str, str]:
    """Log in, open the paused run, press Resume, answer; the form's text and the evidence digest filled in."""
    from playwright.sync_api import expect

    page.goto(run_page.partition("/runs/")[0] + "/login")  # a deep link before logging in shows an error page
    page.get_by_placeholder("admin:pass").fill(auth, timeout=60_000)
    page.get_by_role("button", name="Login").click()
    page.wait_for_url(lambda url: "/login" not in url, timeout=60_000)
    page.goto(run_page)
    page.get_by_role("button", name="Resume").first.click(timeout=90_000)
    form = page.locator(".p-modal")
    form.get_by_text(REPORT).first.wait_for(timeout=60_000)
    shown = form.inner_text()
    digests: list[str] = []

    def shoot(form: Any) -> None:
        digests.append(form.locator("textarea").nth(1).input_value())
        show_the_whole_form(page)
        expect(form.get_by_text(REPORT).first).to_be_in_viewport()
        expect(form.get_by_role("button", name="Submit")).to_be_in_viewport()
        screenshot(page, "prefect-approval.png", folder)

    answer_the_resume_form(page, approver, approve=True, comment="slices look fine in shadow", before_submit=shoot)
    # The canary starts now, with the engines on their own cores of this host: a live UI page, or the
    # browser shutting down, would load one of them and skew the latency comparison. Idle until the decision.
    page.goto("about:blank")
    return shown, digests[0]


@dataclass(frozen=True)
class Approved:
    """What the release manager saw on the Resume form, and the evidence digest it filled in."""

    shown: str
    digest: str


def approved_in_the_ui_and_stays_up(zoo_dir: Path, state: Path, folder: Path) -> tuple[str, Approved]:
    """``revgate demo --approval ui`` left running after its decision: approved on the Prefect UI's Resume form
    in a headless Chromium, then its output up to the tour. Checks what the tour points at while it is up,
    then stops the demo with SIGTERM (as a CI job's end or a service manager does; Ctrl-C takes the same path,
    tests/unit/test_demo_interrupt.py) and checks that nothing it served answers and no process it started runs."""
    deadline = time.monotonic() + 1500
    process = subprocess.Popen(demo_command(zoo_dir, state, "improved", "--approval", "ui"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               start_new_session=True)
    try:
        output = Output(process)
        auth_file = Path(output.wait_for(PREFECT, deadline, "Prefect server").group(2))
        run_page = output.wait_for(RUN_PAGE, deadline, "flow run page").group(1)
        output.wait_for(PAUSED, deadline, "pause for approval")
        with browser_page() as page:  # closed once the demo has decided (see approve_on_the_resume_form)
            approved = Approved(*approve_on_the_resume_form(page, run_page, auth_file.read_text().strip(), APPROVER,
                                                            folder))
            output.wait_for(TOUR, deadline, "the tour after the decision")
        printed = "".join(output.lines)
        assert "The demo stays up; Ctrl-C stops everything." in printed, printed[-3000:]
        urls = {name: re.search(pattern, printed).group(1)  # type: ignore[union-attr]
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
        process.send_signal(signal.SIGTERM)  # after the decision, in the tour
        assert process.wait(120) == 0
        for url in (urls["prefect"], urls["mlflow"], urls["router"]):
            with pytest.raises(httpx.HTTPError):
                httpx.get(url, timeout=5)
    finally:
        kill_all(process)
    assert_nothing_left(state)
    return "".join(output.lines), approved


def kill_all(process: subprocess.Popen[str]) -> None:
    """Kill a demo still running and every process it started (its session), so none outlives the test."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def test_an_improved_revision_approved_on_the_resume_form_is_promoted_and_the_demo_stays_up(
    zoo_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "demo"
    output, approved = approved_in_the_ui_and_stays_up(zoo_dir, state, tmp_path)
    assert "decision: promoted" in output, output[-3000:]
    # The form: the shadow stage's gate report above it, and the digest it names filled in (the answer binds to it).
    assert REPORT in approved.shown, approved.shown
    assert "Any release manager may answer" in approved.shown, approved.shown  # the demo's plan names no approvers
    reported = EVIDENCE.search(" ".join(approved.shown.split()))
    assert reported is not None and approved.digest == reported.group(1), (approved.digest, approved.shown[:2000])
    history = open_route_store(str(state / "routes")).history("demo")
    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    first, last = history[0], history[-1]
    assert any(s.shadow is not None for s in history) and any(s.candidate is not None for s in history)
    assert last.stable.fingerprint != first.stable.fingerprint and last.candidate is None
    alias = client.get_model_version_by_alias("demo", "stable")
    assert alias.tags["revgate.fingerprint"] == last.stable.fingerprint
    run = client.get_run(alias.run_id)  # the version's source run holds the promotion's evidence
    assert run.data.tags["revgate.decision"] == "promoted"
    assert run.data.tags["revgate.step.approval"] == f"approved by {APPROVER}"
    assert {"revgate.step.verify", "revgate.step.isolated-check"} <= set(run.data.tags)
    assert sum(key.startswith("revgate.digest.gate-report-") for key in run.data.tags) >= 2  # shadow and canary
    _, report = last_report(client, tmp_path)
    counts = evidence_counts(report)  # the canary's evidence: probes on both arms, and users' requests
    # Users send 0.5 requests/s and a busy machine's canary stage lasts about 10 s: a handful of requests, split
    # by session between the arms, so one arm may get none (seen once: 4 and 0). Both arms' probes, and users'
    # requests in the stage's evidence, are what must hold.
    assert counts["stable_probes"] > 0 and counts["candidate_probes"] > 0, counts
    assert counts["stable_users"] + counts["candidate_users"] > 0, counts


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


# Where a SIGTERM finds the demo before its decision: the line it waits for, and the demo's options. The
# demo's handler is one for every stage (tests/unit/test_demo_interrupt.py); the tour after the decision is
# stopped by SIGTERM in approved_in_the_ui_and_stays_up. One stage with engines loading and serving is enough
# here: a second whole demo run (the approval pause) cost about three minutes of the suite for the same path.
BEFORE_DECISION = {
    "shadow stage": (re.compile(r"start-candidate.*Finished"), ("--exit",)),
}


@pytest.mark.parametrize("stage", list(BEFORE_DECISION))
def test_a_sigterm_before_the_decision_stops_every_process_the_demo_started(
    stage: str, zoo_dir: Path, tmp_path: Path
) -> None:
    # The defect: SIGTERM outside the demo's last stage ended it at once (the default action), and its
    # Prefect server, worker agent, engines, router, users' traffic and promotion ran on with no parent.
    waited, options = BEFORE_DECISION[stage]
    state = tmp_path / "demo"
    process = subprocess.Popen(demo_command(zoo_dir, state, "improved", *options), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               start_new_session=True)
    try:
        output = Output(process)
        prefect = output.wait_for(re.compile(r"Prefect server at (http://\S+),"), time.monotonic() + 900,
                                  "Prefect server")
        output.wait_for(waited, time.monotonic() + 900, f"the {stage}")
        process.send_signal(signal.SIGTERM)  # to the demo alone, as a service manager sends it
        assert process.wait(180) == 130, "".join(output.lines)[-3000:]
        wait_until(lambda: output.ended, 30, "the demo's last output line")
        assert "interrupted; every process it started is stopped" in "".join(output.lines)
    finally:
        kill_all(process)

    assert_nothing_left(state)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{prefect.group(1)}/api/health", timeout=5)


def assert_nothing_left(state: Path) -> None:
    """No process the demo started (named by its state folder) runs once its grace periods have passed."""
    try:  # stopping a child may take its grace period: polled, with a deadline
        wait_until(lambda: not started_by(state), 60, "every process the demo started ended")
    finally:
        for pid in started_by(state):  # a failing run leaves nothing behind either
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
