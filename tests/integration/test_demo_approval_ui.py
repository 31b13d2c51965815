"""``revgate demo --approval ui``: the demo pauses for a release manager on the Prefect UI's Resume form,
with the shadow stage's gate report above the form, and a person's answer there lets it go on to promotion.

In a headless Chromium: log in to the demo's Prefect UI with the user:password the demo wrote, open the
paused run, press Resume. The form shows the gate report, and its evidence digest field is filled in with
the digest the report names; the approver types a name, switches approve on and submits; the demo ends
promoted, with the approval recorded in the MLflow evidence run under that name.

With ``REVGATE_DOCS_SCREENSHOTS=docs/img`` it retakes docs/img/prefect-approval.png (the form with the
report above it).
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.browser import answer_the_resume_form, browser_page, screenshot
from tests.integration.test_promotion_demo import demo_command, kill_all

pytestmark = [pytest.mark.engine, pytest.mark.servers]

APPROVER = "alice@example.com"
PREFECT = re.compile(r"Prefect server at (\S+), behind basic auth: the UI asks for the user:password in (\S+)")
RUN_PAGE = re.compile(r"View at (\S+/runs/flow-run/[0-9a-f-]+)")  # the flow's first log line
PAUSED = re.compile(r"Pausing flow, execution will continue when this flow run is resumed")
REPORT = "Gates at stage"  # the heading of a gate report's markdown (flows/report.py)
EVIDENCE = re.compile(r"evidence digest (sha256:[0-9a-f]{64})")


class Output:
    """A running process's output, read on a thread of its own, kept whole and matched line by line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

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
    # browser shutting down, would load one of them and skew the latency comparison. Idle until the end.
    page.goto("about:blank")
    return shown, digests[0]


@pytest.mark.timeout(1800)
def test_the_demo_asks_on_the_resume_form_with_the_gate_report_above(zoo_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "demo"
    deadline = time.monotonic() + 1500
    process = subprocess.Popen([*demo_command(zoo_dir, state, "improved", "--approval", "ui", "--exit")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    try:
        output = Output(process)
        auth_file = Path(output.wait_for(PREFECT, deadline, "Prefect server").group(2))
        run_page = output.wait_for(RUN_PAGE, deadline, "flow run page").group(1)
        output.wait_for(PAUSED, deadline, "pause for approval")
        with browser_page() as page:  # closed once the demo has ended (see approve_on_the_resume_form)
            shown, digest = approve_on_the_resume_form(page, run_page, auth_file.read_text().strip(), APPROVER,
                                                       tmp_path)
            code = process.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        kill_all(process)
    printed = "".join(output.lines)
    assert code == 0 and "decision: promoted" in printed, printed[-3000:]
    assert REPORT in shown, shown
    assert "Any release manager may answer" in shown, shown  # the demo's plan names no approvers
    reported = EVIDENCE.search(" ".join(shown.split()))
    assert reported is not None and digest == reported.group(1), (digest, shown[:2000])  # the answer binds to it
    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    run = client.get_run(client.get_model_version_by_alias("demo", "stable").run_id)
    assert run.data.tags["revgate.decision"] == "promoted"
    assert run.data.tags["revgate.step.approval"] == f"approved by {APPROVER}"
