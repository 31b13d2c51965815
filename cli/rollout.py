"""revgate command-line: ``rollback``, which must work with Prefect and MLflow down.

It reads the route's history from the route store, plans the successor snapshot with
``rollback.plan``, commits it with compare-and-swap (one atomic swap), then tells the routers it
knows of to read it now. A router not told (down, unreachable, not listed) picks the change up at
its next poll of the store; a running rollout notices the foreign write and stops.
"""

from __future__ import annotations

import argparse
import getpass
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROUTERS_ENV = "REVGATE_ROUTER_ADMIN_URLS"  # comma-separated admin URLs of the routers to notify
BY_POLLING = "; it picks the rollback up at its next poll of the store"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``rollback``."""
    parser = subparsers.add_parser(
        "rollback",
        help="route back to the last known good revision (aborts a canary first); needs only the route store",
    )
    parser.add_argument("--routes", required=True, help="route store: DIR, file:///DIR or s3://BUCKET/PREFIX")
    parser.add_argument("--route", default="default", help="route name (default: default)")
    parser.add_argument("--created-by", default="", help="who rolls back (audit trail; default: the OS user)")
    parser.add_argument("--dry-run", action="store_true", help="print the planned snapshot, commit nothing")
    parser.add_argument("--notify", action="append", default=[], metavar="ADMIN_URL",
                        help=f"a router's admin URL to tell at once (repeatable; also ${ROUTERS_ENV})")
    parser.add_argument("--admin-token-file", type=Path, help="file holding the routers' admin bearer token")
    parser.add_argument("--tracking-uri", default="",
                        help="MLflow tracking URI: after the commit, move the registry's stable alias to the revision "
                             "rolled back to (a registry that cannot be reached is reported; the rollback stands)")
    parser.add_argument("--model", default="", help="registered model of the route's revisions (default: the route)")
    parser.add_argument("--site", default="", help="the site configuration (default: $REVGATE_SITE when set): when no "
                        "replica of the revision returned to answers, start them through the route's agents, "
                        "verified and warmed, and commit once they are ready")
    parser.add_argument("--no-start", action="store_true",
                        help="never start replicas: refuse, naming what is missing, when none answers")
    parser.add_argument("--force", action="store_true",
                        help="write the rollback even when no endpoint of the revision it returns to answers")
    parser.set_defaults(func=run_rollback)


def run_rollback(args: argparse.Namespace) -> int:
    """Plan and commit the rollback snapshot; print what changed."""
    from revgate.registry.route_store import open_route_store
    from revgate.rollback.land import land, planned_on
    from revgate.serving.worker.engine import answers_health

    store = open_route_store(args.routes)
    token = admin_token(args.admin_token_file)  # a bad token file is refused before anything moves
    by = args.created_by or f"{getpass.getuser()} (revgate rollback)"
    now, force = (lambda: datetime.now(UTC)), args.force
    if args.dry_run:
        planned_on(store, args.route, by=by, now=now, answers=answers_health, force=force)
        print("dry run: nothing committed")
        return 0
    planned = land(store, args.route, by=by, now=now, answers=answers_health, force=force,
                   restore=None if args.no_start else site_restorer(args.site, args.route))
    print(f"committed generation {planned.generation}")
    for url in routers_to_notify(args.notify):
        told = notify_router(url, token) if token else "not told (no --admin-token-file given)" + BY_POLLING
        print(f"  router {url}: {told}")
    if args.tracking_uri:
        from revgate.registry.follow import follow_in_ledger

        print(f"  {follow_in_ledger(args.tracking_uri, args.model or args.route, planned)}")
    return 0


def site_restorer(site: str, route: str) -> Any:
    """Starting the revision's replicas through the route's agents, when a site configuration names them; None
    without one (the rollback then needs replicas that answer: it stays free of Prefect and MLflow)."""
    from revgate.flows.site import SITE_ENV

    path = site or os.environ.get(SITE_ENV, "")
    if not path:
        return None
    from revgate.flows.restore import restorer
    from revgate.flows.site import load_site

    settings = load_site(Path(path)).routes.get(route)
    return None if settings is None else restorer(settings, lambda line: print(line, flush=True))


def admin_token(path: Path | None) -> str:
    """The routers' admin token from ``--admin-token-file``; empty when none is given."""
    from revgate.serving.admin_token import load_admin_token

    return load_admin_token(path) if path is not None else ""


def routers_to_notify(flags: list[str]) -> list[str]:
    """The routers named on the command line and in the environment, each once."""
    named = [*flags, *os.environ.get(ROUTERS_ENV, "").split(",")]
    return list(dict.fromkeys(url.strip().rstrip("/") for url in named if url.strip()))


def notify_router(admin_url: str, token: str, timeout_s: float = 5.0) -> str:
    """Ask one router to re-read the route now; what it answered, or why it will only see it by polling.

    The rollback is committed already: a router that cannot be told is reported, never an error.
    """
    from revgate.manifests.errors import RevgateError
    from revgate.serving.router.admin_client import RouterAdmin

    try:
        answer = RouterAdmin(admin_url, token, timeout_s=timeout_s).notify()
    except (OSError, RevgateError) as error:
        return f"not told ({error})" + BY_POLLING
    return f"serving generation {answer.generation} ({answer.result})"
