"""``revgate promote``: how a run's end becomes the exit code, and which form of the command is which."""

from __future__ import annotations

from pathlib import Path

import pytest

from revgate.cli.main import build_parser
from revgate.cli.promote import NOT_PROMOTED, PROMOTED, REFUSED, RUN_FAILED, RouteView, finish, run_promote, status_args
from revgate.flows.site import RouteSite
from revgate.flows.submit import RunEnd
from tests.unit.test_site import route_settings


@pytest.mark.parametrize(("state", "message", "code", "printed"), [
    ("COMPLETED", "decision: promoted", PROMOTED, "decision: promoted"),
    ("COMPLETED", "decision: rolled_back", NOT_PROMOTED, "decision: rolled_back"),
    ("FAILED", "refused: route 'a' already has a rollout in progress", REFUSED, "refused: route 'a'"),
    ("FAILED", "Flow run encountered an exception: CandidateMissing: candidate sha256:9", RUN_FAILED,
     "without a decision"),
    ("CANCELLED", "", RUN_FAILED, "ended Cancelled"),
])
def test_the_end_of_a_run_is_the_exit_code(
    capsys: pytest.CaptureFixture[str], state: str, message: str, code: int, printed: str
) -> None:
    assert finish(RunEnd("id", state, state.title(), message)) == code
    assert printed in capsys.readouterr().out


def test_a_route_without_a_candidate_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["promote", "chat"])
    assert run_promote(args) == 2
    assert "give ROUTE CANDIDATE" in capsys.readouterr().err


def test_the_spec_file_form_and_the_named_form_parse() -> None:
    spec_form = build_parser().parse_args(["promote", str(Path("promotion.json"))])
    assert spec_form.target == "promotion.json" and spec_form.candidate == ""
    named = build_parser().parse_args(["promote", "chat", "improved", "--policy", "strict", "--plan", "ladder"])
    assert (named.target, named.candidate, named.policy, named.plan, named.local) == (
        "chat", "improved", "strict", "ladder", False)
    with pytest.raises(SystemExit):  # the approval mode is the site's: no command line chooses it
        build_parser().parse_args(["promote", "chat", "improved", "--approval", "auto"])


def test_a_paused_run_points_at_its_approval_form() -> None:
    from uuid import uuid4

    from prefect.client.schemas.objects import FlowRun
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings
    from prefect.states import Paused, Running

    from revgate.flows.submit import describe

    run_id = uuid4()
    with temporary_settings(updates={PREFECT_API_URL: "http://prefect.internal:4200/api", PREFECT_UI_URL: None}):
        paused = describe(FlowRun(id=run_id, flow_id=uuid4(), state=Paused(timeout_seconds=60)))
        running = describe(FlowRun(id=run_id, flow_id=uuid4(), state=Running()))
    assert paused.startswith("Paused")
    assert f"approve or reject at http://prefect.internal:4200/runs/flow-run/{run_id}" in paused
    assert running == "Running"


def test_the_followed_run_shows_the_routes_view_from_the_site_with_every_router_and_worker() -> None:
    settings = RouteSite.model_validate(route_settings(more_workers=["http://gpu-2:9000"],
                                                       more_routers=["http://router-b:8081"]))
    args = status_args("chat", settings)
    assert (args.route_name, args.routes) == ("chat", "s3://routes/prod")
    assert args.router == ["http://router:8081", "http://router-b:8081"]
    assert args.worker == ["http://gpu-1:9000", "http://gpu-2:9000"]
    assert args.tracking_uri == "http://mlflow:5000" and args.timeout > 0


def test_the_view_is_printed_when_it_changes_and_never_breaks_following(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from revgate.cli import status as status_module
    views = iter(["route chat  generation 2  stage canary", "route chat  generation 2  stage canary",
                  "route chat  generation 3  stage stable"])

    def gather(args: object) -> str:
        text = next(views, None)
        if text is None:
            raise OSError("a router does not answer")
        return text

    monkeypatch.setattr(status_module, "gather", gather)
    monkeypatch.setattr(status_module, "render", lambda status: status)
    monkeypatch.setattr("revgate.cli.promote.VIEW_EVERY_S", 0.0)
    view = RouteView(status_args("chat", RouteSite.model_validate(route_settings())))
    for _ in range(4):
        view()
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["    route chat  generation 2  stage canary", "    route chat  generation 3  stage stable"]
