"""``revgate status ROUTE``: where a route stands, from every part that knows, in one view.

The route store says the stage, weights and generation; each router's ``/admin/health`` the
generation it serves; each worker agent its replicas; the MLflow ledger the rollout's newest gate
report and the Prefect flow run that wrote it. Gathering is I/O at the edge; the view, its JSON and
its exit code are plain functions over frozen types. A part that cannot be reached is shown as
unreachable; only the route store is needed.

Exit codes (documented in docs/operations.md): 0 stable and healthy, 1 rollout in progress
(a candidate or shadow on the route), 2 degraded (a router not on the store's generation or
unreachable, a worker unreachable, a routed replica not ready), 3 route store unreachable, no
such route, or bad input.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from revgate.manifests.errors import RevgateError
from revgate.manifests.route import RouteNotFound, RouteSnapshot
from revgate.promotion.window import OPEN_UNTIL, WINDOW_TAG
from revgate.serving.router.admin_client import RouterAdmin, RouterHealth

EXIT_STABLE, EXIT_ROLLOUT, EXIT_DEGRADED, EXIT_BAD = 0, 1, 2, 3
UNREACHABLE = "unreachable"
SCHEMA = "revgate/status/v1"
PPM = 1_000_000


@dataclass(frozen=True, slots=True)
class Target:
    """One revision on the route: its fingerprint, share of traffic (ppm) and endpoints."""

    fingerprint: str
    ppm: int
    endpoints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RouterState:
    """What one router's ``/admin/health`` said (generation None: unreachable)."""

    url: str
    status: str  # ok, degraded (the router's own word), behind, unreachable
    generation: int | None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica a worker agent holds."""

    replica_id: str
    revision: str
    state: str
    endpoint: str


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker agent's replicas (reachable False: none could be read)."""

    url: str
    reachable: bool
    replicas: tuple[ReplicaState, ...]
    detail: str = ""


@dataclass(frozen=True, slots=True)
class SliceState:
    """One gate's slice in the newest report, with its samples per arm."""

    gate: str
    slice: str
    outcome: str
    stable_samples: int | None
    candidate_samples: int | None


@dataclass(frozen=True, slots=True)
class GateState:
    """The rollout's newest gate report."""

    report: str
    outcome: str
    stable_requests: int
    candidate_requests: int
    gates: tuple[tuple[str, str], ...]
    slices: tuple[SliceState, ...]


@dataclass(frozen=True, slots=True)
class RunLinks:
    """The rollout's evidence run in MLflow and its flow run in Prefect; a state per side."""

    mlflow: str  # found, none (no run of this route), unreachable, not configured
    run_id: str = ""
    run_url: str = ""
    decision: str = ""
    window: str = ""  # the rollback window after a promotion: "open until T", then how it ended
    gates: GateState | None = None
    prefect: str = "not configured"  # the flow run's state name, none, unreachable, not configured
    flow_run_id: str = ""
    flow_run_url: str = ""
    detail: str = ""  # why a side is unreachable


@dataclass(frozen=True, slots=True)
class RouteStatus:
    """Everything ``revgate status`` shows about one route."""

    route: str
    generation: int
    stage: str
    stable: Target
    candidate: Target | None
    shadow: Target | None
    routers: tuple[RouterState, ...]
    workers: tuple[WorkerState, ...]
    links: RunLinks


# --- pure: the view, its JSON and its exit code ------------------------------------------------


def stage_of(snapshot: RouteSnapshot) -> str:
    """stable (one revision), shadow (mirrored copies only), canary (a share of the callers), or both."""
    if snapshot.candidate and snapshot.shadow:
        return "shadow+canary"
    if snapshot.candidate:
        return "canary"
    return "shadow" if snapshot.shadow else "stable"


def targets(snapshot: RouteSnapshot) -> tuple[Target, Target | None, Target | None]:
    """Stable, candidate and shadow with their shares of traffic."""
    weight = snapshot.candidate.weight_ppm if snapshot.candidate else 0
    stable = Target(snapshot.stable.fingerprint, PPM - weight, snapshot.stable.endpoints)
    candidate = (Target(snapshot.candidate.fingerprint, weight, snapshot.candidate.endpoints)
                 if snapshot.candidate else None)
    shadow = (Target(snapshot.shadow.fingerprint, snapshot.shadow.sample_ppm, snapshot.shadow.endpoints)
              if snapshot.shadow else None)
    return stable, candidate, shadow


def router_state(url: str, health: RouterHealth | None, generation: int, error: str = "") -> RouterState:
    """A router's state against the store: behind when it serves an older generation than the store holds."""
    if health is None:
        return RouterState(url, UNREACHABLE, None, error)
    served = health.generation
    if served < generation:
        return RouterState(url, "behind", served, f"serves generation {served}, the store holds {generation}")
    return RouterState(url, health.status, served)


def routed_endpoints(status: RouteStatus) -> set[str]:
    """Every endpoint the route sends to (stable, candidate, shadow)."""
    chosen = [status.stable, status.candidate, status.shadow]
    return {url.rstrip("/") for target in chosen if target is not None for url in target.endpoints}


def problems(status: RouteStatus) -> list[str]:
    """What makes the route degraded, one line each (empty: healthy)."""
    found = [f"router {r.url}: {r.status}{': ' + r.detail if r.detail else ''}" for r in status.routers
             if r.status != "ok"]
    found += [f"worker {w.url}: unreachable: {w.detail}" for w in status.workers if not w.reachable]
    routed = routed_endpoints(status)
    found += [f"replica {p.replica_id} on {w.url} is {p.state} but routed" for w in status.workers
              for p in w.replicas if p.endpoint.rstrip("/") in routed and p.state != "ready"]
    return found


def exit_code(status: RouteStatus) -> int:
    """2 degraded (first: it needs a person), else 1 while a candidate or shadow is routed, else 0."""
    if problems(status):
        return EXIT_DEGRADED
    return EXIT_ROLLOUT if status.stage != "stable" else EXIT_STABLE


def status_json(status: RouteStatus) -> dict[str, Any]:
    """The ``--json`` document (schema ``revgate/status/v1``, described in docs/operations.md)."""
    data = asdict(status)
    return {"schema": SCHEMA, **data, "problems": problems(status), "exit_code": exit_code(status)}


def _share(ppm: int) -> str:
    return f"{ppm / PPM:.2%}".rstrip("0").rstrip(".") if ppm % 10_000 else f"{ppm // 10_000}%"


def render(status: RouteStatus) -> str:
    """The view as text: one block per part, problems last."""
    lines = [f"route {status.route}  generation {status.generation}  stage {status.stage}"]
    for label, target in (("stable", status.stable), ("candidate", status.candidate), ("shadow", status.shadow)):
        if target is not None:
            share = "mirrored " + _share(target.ppm) if label == "shadow" else _share(target.ppm)
            lines.append(f"  {label:<9} {target.fingerprint[:19]}  {share:>9}  {', '.join(target.endpoints)}")
    lines.append("routers" + ("" if status.routers else ": none given (--router)"))
    lines += [f"  {r.url}  generation {r.generation if r.generation is not None else '-'}  {r.status}"
              + (f"  ({r.detail})" if r.detail else "") for r in status.routers]
    lines.append("workers" + ("" if status.workers else ": none given (--worker)"))
    for worker in status.workers:
        if not worker.reachable:
            lines.append(f"  {worker.url}  {UNREACHABLE}  ({worker.detail})")
            continue
        lines.append(f"  {worker.url}  {len(worker.replicas)} replica(s)")
        lines += [f"    {p.replica_id}  {p.revision[:19]}  {p.state:<10} {p.endpoint}" for p in worker.replicas]
    lines += _render_links(status.links)
    found = problems(status)
    lines += [f"DEGRADED: {line}" for line in found]
    return "\n".join(lines)


def window_line(window: str, now: datetime) -> str:
    """The rollback window as the run's tag says, and whether an open one is past its end: its controller
    died inside it (nothing closes the tag then; `revgate gc` reaps the old stable after its hold)."""
    if not window.startswith(OPEN_UNTIL):
        return window
    try:
        ends = datetime.fromisoformat(window.removeprefix(OPEN_UNTIL))
    except ValueError:
        return window
    if ends >= now:
        return window
    return f"{window}: past, and no controller closed it (it died inside the window)"


def _render_links(links: RunLinks) -> list[str]:
    lines = [f"mlflow run  {links.run_id or links.mlflow}" + (f"  {links.run_url}" if links.run_url else "")
             + (f"  decision {links.decision}" if links.decision else "")]
    if links.window:
        lines.append(f"window      {window_line(links.window, datetime.now(UTC))}")
    lines.append(f"prefect run {links.flow_run_id or '-'}  {links.prefect}"
                 + (f"  {links.flow_run_url}" if links.flow_run_url else ""))
    gates = links.gates
    if gates is None:
        lines.append(f"gates       {'none reported yet' if links.mlflow == 'found' else links.mlflow}")
        return lines
    lines.append(f"gates       {gates.report}: {gates.outcome}  (stable {gates.stable_requests}, "
                 f"candidate {gates.candidate_requests} requests)")
    lines += [f"  {gate:<22} {outcome}" for gate, outcome in gates.gates]
    lines += [f"    {s.gate}/{s.slice:<20} {s.outcome:<13} samples stable {s.stable_samples} candidate "
              f"{s.candidate_samples}" for s in gates.slices]
    return lines


def gate_state(name: str, report: Any) -> GateState:
    """The newest report (a GateReport) as the view shows it."""

    def samples(numbers: dict[str, str], key: str) -> int | None:
        value = numbers.get(key) or numbers.get("pairs")
        return int(value) if value and value.isdigit() else None

    slices = tuple(SliceState(g.gate, s.slice, s.outcome, samples(s.numbers, "stable_samples"),
                              samples(s.numbers, "candidate_samples")) for g in report.gates for s in g.slices)
    return GateState(name, report.outcome, report.stable.requests, report.candidate.requests,
                     tuple((g.gate, g.outcome) for g in report.gates), slices)


# --- edges: reading each part -----------------------------------------------------------------


def _token(path: Path | None) -> str:
    return path.read_text(encoding="utf-8").strip() if path else ""


def _get_json(url: str, token: str, timeout_s: float, scheme: str = "Bearer") -> dict[str, Any]:
    request = urllib.request.Request(url)  # noqa: S310 (the operator names the URL)
    if token:
        request.add_header("Authorization", f"{scheme} {token}")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def read_router(url: str, token: str, generation: int, timeout_s: float) -> RouterState:
    """``/admin/health`` of the router whose admin port is at ``url``."""
    try:
        return router_state(url, RouterAdmin(url, token, timeout_s=timeout_s).health(), generation)
    except (OSError, RevgateError) as error:
        return router_state(url, None, generation, str(getattr(error, "reason", error)))


def read_worker(url: str, token: str, timeout_s: float) -> WorkerState:
    """The worker agent's replicas (its control API)."""
    from revgate.serving.worker.client import WorkerClient

    try:
        views = WorkerClient(url, token, timeout_s=timeout_s).replicas()
    except (OSError, RevgateError) as error:
        return WorkerState(url, False, (), str(getattr(error, "reason", error)))
    replicas = tuple(ReplicaState(v.replica_id, v.revision, v.state, v.endpoint) for v in views)
    return WorkerState(url, True, replicas)


def read_links(route: str, tracking_uri: str, mlflow_ui: str, prefect_api: str, timeout_s: float) -> RunLinks:
    """The route's newest evidence run, its newest gate report and its Prefect flow run, where reachable."""
    if not tracking_uri:
        return RunLinks(mlflow="not configured", prefect=_prefect_alone(prefect_api))
    if _missing_sqlite_store(tracking_uri):  # opening it would create it: a status read writes nothing
        return RunLinks(mlflow="none", prefect=_prefect_alone(prefect_api))
    try:
        run, report = _newest_run(route, tracking_uri)
    except Exception as error:  # any failure of the tracking server reads as unreachable
        return RunLinks(mlflow=UNREACHABLE, prefect=_prefect_alone(prefect_api),
                        detail=f"{type(error).__name__}: {str(error)[:200]}")
    if run is None:
        return RunLinks(mlflow="none", prefect=_prefect_alone(prefect_api))
    tags = dict(run.data.tags)
    run_id, experiment = run.info.run_id, run.info.experiment_id
    flow_run_id = tags.get("prefect_flow_run_id", "")
    prefect = _flow_run_state(prefect_api, flow_run_id, timeout_s) if flow_run_id else "none"
    ui = prefect_api.rstrip("/").removesuffix("/api")
    return RunLinks(
        mlflow="found", run_id=run_id, decision=tags.get("revgate.decision", ""),
        window=tags.get(WINDOW_TAG, ""),
        run_url=f"{mlflow_ui.rstrip('/')}/#/experiments/{experiment}/runs/{run_id}" if mlflow_ui else "",
        gates=gate_state(*report) if report else None, prefect=prefect, flow_run_id=flow_run_id,
        flow_run_url=f"{ui}/runs/flow-run/{flow_run_id}" if flow_run_id and prefect_api else "",
    )


def _missing_sqlite_store(tracking_uri: str) -> bool:
    """A ``sqlite:///PATH`` tracking store whose file does not exist yet (so no run is in it)."""
    from revgate.registry.ledger import sqlite_file

    database = sqlite_file(tracking_uri)
    return database is not None and not database.exists()


def _newest_run(route: str, tracking_uri: str) -> tuple[Any, tuple[str, Any] | None]:
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a server that is down answers at once
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    from revgate.registry.ledger import EvidenceLedger  # heavy: mlflow

    ledger = EvidenceLedger(tracking_uri, Path("."))
    run = ledger.latest_run(route)
    return run, (ledger.latest_gate_report(run.info.run_id) if run is not None else None)


def _prefect_alone(prefect_api: str) -> str:
    return "none" if prefect_api else "not configured"


def _flow_run_state(prefect_api: str, flow_run_id: str, timeout_s: float) -> str:
    if not prefect_api:
        return "not configured"
    try:
        # A server behind basic auth (PREFECT_SERVER_API_AUTH_STRING) takes what Prefect's own clients send.
        auth = os.environ.get("PREFECT_API_AUTH_STRING", "")
        basic = base64.b64encode(auth.encode()).decode() if auth else ""
        run = _get_json(f"{prefect_api.rstrip('/')}/flow_runs/{flow_run_id}", basic, timeout_s, scheme="Basic")
    except (OSError, ValueError):
        return UNREACHABLE
    return str((run.get("state") or {}).get("name", "unknown"))


def gather(args: argparse.Namespace) -> RouteStatus:
    """Read every part; RouteNotFound / RouteStoreUnavailable when the store cannot say (exit 3)."""
    from revgate.registry.route_store import open_route_store  # keep `revgate --help` fast

    snapshot = open_route_store(args.routes).read(args.route_name)
    if snapshot is None:
        raise RouteNotFound(f"route {args.route_name!r} has no snapshot", where=args.routes,
                            fix="Check the route name and --routes; create a route with `revgate route set`.")
    stable, candidate, shadow = targets(snapshot)
    router_token, worker_token = _token(args.router_token_file), _token(args.worker_token_file)
    return RouteStatus(
        route=snapshot.route, generation=snapshot.generation, stage=stage_of(snapshot),
        stable=stable, candidate=candidate, shadow=shadow,
        routers=tuple(read_router(url, router_token, snapshot.generation, args.timeout) for url in args.router),
        workers=tuple(read_worker(url, worker_token, args.timeout) for url in args.worker),
        links=read_links(snapshot.route, args.tracking_uri, args.mlflow_ui, args.prefect_api, args.timeout),
    )


# --- the command ------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``status``."""
    parser = subparsers.add_parser("status", help="a route's stage, weights, routers, replicas, gates and runs")
    parser.add_argument("route_name", metavar="ROUTE", help="route name")
    parser.add_argument("--routes", required=True, help="route store: DIR, file:///DIR or s3://BUCKET/PREFIX")
    parser.add_argument("--router", action="append", default=[], help="a router's admin URL (repeat per router)")
    parser.add_argument("--router-token-file", type=Path, help="file holding the routers' admin token")
    parser.add_argument("--worker", action="append", default=[], help="a worker agent's URL (repeat per agent)")
    parser.add_argument("--worker-token-file", type=Path, help="file holding the worker agents' token")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", ""),
                        help="MLflow tracking URI of the evidence ledger (default: $MLFLOW_TRACKING_URI)")
    parser.add_argument("--mlflow-ui", default="", help="MLflow UI base URL, for the run's link")
    parser.add_argument("--prefect-api", default=os.environ.get("PREFECT_API_URL", ""),
                        help="Prefect API URL (default: $PREFECT_API_URL); the UI link is derived from it")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per request to each part")
    parser.add_argument("--json", action="store_true", help="print the schema revgate/status/v1 document")
    parser.add_argument("--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
                        help="refresh every SECONDS (default 2) until Ctrl-C; live with rich when installed")
    parser.add_argument("--rounds", type=int, help="with --watch: stop after this many views (for scripts)")
    parser.set_defaults(func=run_status)
    parser.error = _usage_error  # bad input exits 3, like a route store that cannot say


def _usage_error(message: str) -> NoReturn:
    print(f"revgate status: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD)


def run_status(args: argparse.Namespace) -> int:
    """Show the status once (or ``--watch`` it); the exit code of the last view."""
    try:
        if args.watch is not None:
            return watch(args, args.watch, rounds=args.rounds)
        status = gather(args)
    except RevgateError as error:
        print(f"revgate: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_BAD
    print(json.dumps(status_json(status), indent=2, sort_keys=True) if args.json else render(status))
    return exit_code(status)


def watch(args: argparse.Namespace, every_s: float, *, rounds: int | None = None) -> int:
    """Refresh until interrupted (or ``rounds`` views, for scripts): rich's live view, else a cleared screen."""
    show: Callable[[str], None]
    code = EXIT_BAD
    live = _rich_live() if sys.stdout.isatty() else None  # piped: every view printed in full
    try:
        if live is not None:
            live.start()
            show = partial(_live_update, live)
        else:
            show = _plain_refresh
        shown = 0
        while rounds is None or shown < rounds:
            status = gather(args)
            code = exit_code(status)
            show(json.dumps(status_json(status), sort_keys=True) if args.json else render(status))
            shown += 1
            if rounds is None or shown < rounds:
                time.sleep(every_s)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return code


def _live_update(live: Any, text: str) -> None:
    from rich.text import Text

    live.update(Text(text), refresh=True)


def _rich_live() -> Any:
    """A rich Live display (rich comes with prefect), or None without rich."""
    try:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text
    except ImportError:
        return None
    return Live(Text(""), console=Console(), auto_refresh=False)


def _plain_refresh(text: str) -> None:
    sys.stdout.write("\x1b[2J\x1b[H" + text + "\n" if sys.stdout.isatty() else text + "\n")
    sys.stdout.flush()
