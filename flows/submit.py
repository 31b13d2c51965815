"""Asking the Prefect API for a deployment's run, as the UI's Run button does, and following it to its end.

Also the one-time setup of a site: the ``revgate`` process work pool and the deployments of prefect.yaml.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import FlowRun, State
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL

from revgate.flows.deployment import DECISION, REFUSED
from revgate.flows.outage import asking_once, prefect_unreachable
from revgate.flows.promote import DECIDED
from revgate.manifests.errors import RevgateError

WORK_POOL = "revgate"
PROMOTE = "promote/promote-revision"  # flow name / deployment name, as prefect.yaml declares them
ROLLBACK = "rollback/rollback-route"


class DeploymentMissing(RevgateError):
    """The Prefect API has no such deployment (or cannot be reached)."""


class DeployFailed(RevgateError):
    """Applying prefect.yaml failed."""


@dataclass(frozen=True)
class RunEnd:
    """How a flow run ended: its state and the state's message."""

    flow_run_id: str
    state_type: str  # COMPLETED, FAILED, CRASHED, CANCELLED
    state_name: str
    message: str

    @property
    def decision(self) -> str:
        """The promotion's decision (promoted, rolled_back, failed); empty when the run ended without one."""
        return self.message.removeprefix(DECISION) if self.message.startswith(DECISION) else ""

    @property
    def refused(self) -> bool:
        """Refused before it started: another rollout holds the route."""
        return self.message.startswith(REFUSED)


def run_url(flow_run_id: str) -> str:
    """The flow run's page in the Prefect UI (where a paused run's approval form is)."""
    ui = PREFECT_UI_URL.value() or str(PREFECT_API_URL.value() or "").removesuffix("/api")
    return f"{ui.rstrip('/')}/runs/flow-run/{flow_run_id}"


def state_end(flow_run_id: str, state: State[Any]) -> RunEnd:
    """A final state as a RunEnd."""
    return RunEnd(flow_run_id, state.type.value, state.name or state.type.value, state.message or "")


def submit(deployment: str, parameters: dict[str, Any]) -> FlowRun:
    """Create a run of ``deployment`` with these parameters; a worker of its pool picks it up."""
    try:
        with get_client(sync_client=True) as client:
            found = client.read_deployment_by_name(deployment)
            return client.create_flow_run_from_deployment(found.id, parameters=parameters)
    except ObjectNotFound:
        raise DeploymentMissing(
            f"no deployment {deployment!r}", where=str(PREFECT_API_URL.value()),
            fix="Create the work pool and deployments with `revgate deploy` (docs/operations.md).",
        ) from None
    except (httpx.HTTPError, OSError) as error:
        raise DeploymentMissing(
            f"the Prefect API cannot be reached ({error})", where=str(PREFECT_API_URL.value()),
            fix="Start the Prefect server or set PREFECT_API_URL to it.",
        ) from None


def describe(run: FlowRun) -> str:
    """One line for a state change."""
    state = run.state
    if state is None:
        return "no state yet"
    line = f"{state.name}" + (f": {state.message}" if state.message else "")
    if state.is_paused():
        line += f"\n  waiting for a release manager: approve or reject at {run_url(str(run.id))}"
    return line


def follow_run(flow_run_id: UUID, report: Callable[[str], None], *, poll_s: float = 1.0,
               timeout_s: float | None = None, tick: Callable[[], None] | None = None,
               until_decided: bool = False) -> RunEnd:
    """Report each state change of the run until it ends (calling ``tick`` at every poll); how it ended.

    ``until_decided``: return as soon as the flow logs its decision, while its rollback window still
    watches (the run goes on; ``revgate status`` says how the window ends).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    seen, away = "", False
    with asking_once() as client:
        while True:
            try:
                run = client.read_flow_run(flow_run_id)
                decided = until_decided and run.state is not None and run.state.is_running() and \
                    decided_line(client, flow_run_id)
            except Exception as error:
                if not prefect_unreachable(error):
                    raise
                if not away:  # the run goes on without Prefect (its leases are the heartbeat's)
                    report(f"the Prefect API is away ({type(error).__name__}): the run goes on; asking again")
                away = True
            else:
                if away:
                    report("the Prefect API is back")
                away = False
                line = describe(run)
                if line != seen:
                    report(line)
                    seen = line
                if run.state is not None and run.state.is_final():
                    return state_end(str(flow_run_id), run.state)
                if decided:
                    report(decided)
                    decision = decided.removeprefix(DECIDED).split(";", 1)[0]
                    return RunEnd(str(flow_run_id), "RUNNING", "Running (rollback window)", f"{DECISION}{decision}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"flow run {flow_run_id} did not end within {timeout_s} s")
            if tick is not None:  # the route's live view needs no Prefect
                tick()
            time.sleep(poll_s)


def decided_line(client: Any, flow_run_id: UUID) -> str:
    """The flow's ``decided: ...`` log line, once it logged one; empty before."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                            limit=200, sort=LogSort.TIMESTAMP_DESC)
    return next((str(log.message) for log in logs if str(log.message).startswith(DECIDED)), "")


def ensure_work_pool(name: str = WORK_POOL) -> bool:
    """Create the process work pool if it is missing; whether it was created."""
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
            return True
    return False


def packaged_prefect_file() -> Path:
    """The deployments as the installed package carries them (flows/prefect.yaml)."""
    return Path(str(resources.files("revgate.flows") / "prefect.yaml"))


def deploy(prefect_file: Path) -> str:
    """Apply every deployment of ``prefect_file`` (``prefect --no-prompt deploy --all``); its output."""
    if not prefect_file.is_file():
        raise DeployFailed("no such deployments file", where=str(prefect_file),
                           fix="Leave out --prefect-file to apply the deployments the package carries, "
                               "or name a prefect.yaml that exists.")
    # The entrypoints are modules of the installed package, so the caller's folder plays no part; an empty one
    # keeps Prefect from reading or writing anything beside the caller's files (or inside the package).
    with tempfile.TemporaryDirectory(prefix="revgate-deploy-") as folder:
        result = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all",
                                 "--prefect-file", str(prefect_file.resolve())], cwd=folder,
                                capture_output=True, text=True, check=False, timeout=300)
    if result.returncode != 0:
        raise DeployFailed(f"prefect deploy exited with {result.returncode}", where=str(prefect_file),
                           fix="Its output:\n" + (result.stdout + result.stderr)[-3000:])
    return result.stdout
