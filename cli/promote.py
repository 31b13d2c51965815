"""revgate command-line: ``promote`` (a run of the promote-revision Prefect deployment, or a spec file run
here) and ``deploy`` (the work pool and the deployments of prefect.yaml)."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from revgate.flows.site import RouteSite
    from revgate.flows.submit import RunEnd

VIEW_EVERY_S = 5.0  # how often the route's view is read while a run is followed


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``promote`` and ``deploy``."""
    promote = subparsers.add_parser(
        "promote", help="roll a candidate out on a route: a run of the promote-revision Prefect deployment")
    promote.add_argument("target", metavar="ROUTE|SPEC.json",
                         help="the route (site configuration name); or a promotion spec file, run in this process")
    promote.add_argument("candidate", nargs="?", default="",
                         help="manifest digest (sha256:...) or a candidate name from the route's site configuration")
    promote.add_argument("--policy", default="", help="gate policy by name (default: the route's)")
    promote.add_argument("--plan", default="", help="rollout plan by name (default: the route's)")
    promote.add_argument("--requested-by", default="", help="who asks (audit trail; default: the OS user)")
    promote.add_argument("--local", action="store_true",
                         help="run the flow in this process instead of on a worker (reads the site configuration)")
    promote.add_argument("--site", default="",
                         help="site configuration for --local (default: $REVGATE_SITE, else ./revgate-site.json)")
    promote.add_argument("--no-follow", action="store_true", help="print the submitted run and return at once")
    promote.add_argument("--wait-window", action="store_true",
                         help="after a promotion, follow the run to the rollback window's end (default: return at "
                              "the decision; `revgate status` says how the window ends)")
    promote.set_defaults(func=run_promote)
    deploy = subparsers.add_parser("deploy", help="create the revgate work pool and the deployments of prefect.yaml")
    deploy.add_argument("--prefect-file", type=Path, default=None,
                        help="deployments file to apply (default: the one the package carries, flows/prefect.yaml)")
    deploy.set_defaults(func=run_deploy)


# Exit codes of `revgate promote`.
PROMOTED, NOT_PROMOTED, REFUSED, RUN_FAILED, INTERRUPTED = 0, 3, 4, 5, 130


def run_promote(args: argparse.Namespace) -> int:
    """A spec file runs here; a route and candidate become a deployment run (or a local one with --local)."""
    if args.target.endswith(".json") and not args.candidate:
        return run_spec(Path(args.target))
    if not args.candidate:
        print("revgate promote: give ROUTE CANDIDATE, or a promotion spec file SPEC.json", file=sys.stderr)
        return 2
    parameters = {"route": args.target, "candidate": args.candidate, "policy": args.policy, "plan": args.plan,
                  "requested_by": args.requested_by or getpass.getuser()}
    if args.local:
        return run_local(parameters, args.site)
    return run_deployment(parameters, follow=not args.no_follow, wait_window=args.wait_window)


def run_spec(path: Path) -> int:
    """Run the flow for a whole spec against the Prefect API in PREFECT_API_URL; 0 when promoted, 3 otherwise."""
    from revgate.flows.promote import promote_revision
    from revgate.flows.spec import PromotionSpec

    spec = PromotionSpec.model_validate_json(path.read_text(encoding="utf-8"))
    decision = promote_revision(spec)
    print(f"decision: {decision}")
    return PROMOTED if decision == "promoted" else NOT_PROMOTED


def run_deployment(parameters: dict[str, str], *, follow: bool, wait_window: bool = False) -> int:
    """Submit the run through the Prefect API and follow it to its decision (or its end, ``wait_window``),
    printing each state change."""
    from revgate.flows.submit import PROMOTE, follow_run, run_url, submit

    run = submit(PROMOTE, parameters)
    print(f"flow run {run.name} ({run.id}) submitted to {PROMOTE}: {run_url(str(run.id))}", flush=True)
    if not follow:
        return 0
    try:
        end = follow_run(run.id, lambda line: print(f"  {line}", flush=True),
                         tick=route_view(parameters["route"]), until_decided=not wait_window)
    except KeyboardInterrupt:  # only the following stops: the run is the worker's
        print(f"stopped following; the run goes on (cancel it in the UI): {run_url(str(run.id))}")
        return INTERRUPTED
    return finish(end)


def status_args(route: str, settings: RouteSite) -> argparse.Namespace:
    """``revgate status``'s arguments for a route of the site configuration."""
    return argparse.Namespace(
        route_name=route, routes=settings.route_store,
        router=list(dict.fromkeys((settings.router_admin_url, *settings.more_routers))),
        router_token_file=Path(settings.router_admin_token_file),
        worker=list(dict.fromkeys((settings.worker_url, *settings.more_workers))),
        worker_token_file=Path(settings.worker_token_file), tracking_uri=settings.tracking_uri, mlflow_ui="",
        prefect_api=os.environ.get("PREFECT_API_URL", ""), timeout=3.0,
    )


class RouteView:
    """The route's `revgate status` view, printed when it changed, at most every few seconds."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.text = ""
        self.read_at = 0.0

    def __call__(self) -> None:
        from revgate.cli.status import gather, render

        if time.monotonic() - self.read_at < VIEW_EVERY_S:
            return
        self.read_at = time.monotonic()
        try:
            text = render(gather(self.args))
        except Exception:  # a part not answering now: the next look tries again
            return
        if text != self.text:
            self.text = text
            print("\n".join(f"    {line}" for line in text.splitlines()), flush=True)


def route_view(route: str) -> RouteView | None:
    """While a run is followed, the route's view; None when this host cannot read its site configuration
    (following the run never depends on the view)."""
    try:
        from revgate.flows.site import load_site, site_path

        settings = load_site(site_path()).routes[route]
    except Exception:  # no site configuration here: the run's states alone
        return None
    return RouteView(status_args(route, settings))


def run_local(parameters: dict[str, str], site: str) -> int:
    """Run the deployment's flow in this process (still reporting to the Prefect API)."""
    from revgate.flows.deployment import promote
    from revgate.flows.site import SITE_ENV
    from revgate.flows.submit import state_end

    if site:
        os.environ[SITE_ENV] = site
    state = promote(**parameters, return_state=True)  # type: ignore[call-overload]
    return finish(state_end(str(state.state_details.flow_run_id), state))


def finish(end: RunEnd) -> int:
    """Print how the run ended; the exit code."""
    if end.refused:
        print(f"refused: {end.message.removeprefix('refused: ')}")
        return REFUSED
    if end.decision:
        print(f"decision: {end.decision}")
        return PROMOTED if end.decision == "promoted" else NOT_PROMOTED
    print(f"the run ended {end.state_name} without a decision: {end.message}")
    return RUN_FAILED


def run_deploy(args: argparse.Namespace) -> int:
    """Create the work pool if missing and apply prefect.yaml's deployments."""
    from revgate.flows.submit import PROMOTE, ROLLBACK, WORK_POOL, deploy, ensure_work_pool, packaged_prefect_file

    prefect_file = (args.prefect_file or packaged_prefect_file()).resolve()
    created = ensure_work_pool()
    print(f"work pool {WORK_POOL}: {'created' if created else 'exists'} (process)")
    deploy(prefect_file)
    print(f"deployments {PROMOTE} and {ROLLBACK} applied from {prefect_file}")
    print(f"start a worker on each rollout host: prefect worker start --pool {WORK_POOL}")
    return 0
