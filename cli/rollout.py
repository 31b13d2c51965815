"""revgate command-line: ``rollback``, which must work with Prefect and MLflow down.

It reads the route's history from the route store, plans the successor snapshot with
``rollback.plan``, commits it with compare-and-swap (one atomic swap), then tells the routers it
knows of to read it now. A router not told (down, unreachable, not listed) picks the change up at
its next poll of the store; a running rollout notices the foreign write and stops.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROUTERS_ENV = "REVGATE_ROUTER_ADMIN_URLS"  # comma-separated admin URLs of the routers to notify
CONFLICT_ATTEMPTS = 5  # a rollback planned again on top of a concurrent write, this many times at most


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
    parser.add_argument("--force", action="store_true",
                        help="write the rollback even when no endpoint of the revision it returns to answers")
    parser.set_defaults(func=run_rollback)


def run_rollback(args: argparse.Namespace) -> int:
    """Plan and commit the rollback snapshot; print what changed."""
    from manifests.route import RouteConflict
    from registry.route_store import open_route_store

    store = open_route_store(args.routes)
    by = args.created_by or f"{getpass.getuser()} (revgate rollback)"
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        planned = plan(store, args, by)
        if args.dry_run:
            print("dry run: nothing committed")
            return 0
        try:
            store.write(planned)  # compare-and-swap: a concurrent change makes this fail and change nothing
            break
        except RouteConflict:
            if attempt == CONFLICT_ATTEMPTS:
                raise
            # A live rollout's heartbeat writes a generation per renewal: plan again on top of it.
            print(f"the route changed during the rollback (attempt {attempt}); planning again on the new generation")
    print(f"committed generation {planned.generation}")
    token = args.admin_token_file.read_text(encoding="utf-8").strip() if args.admin_token_file else ""
    for url in routers_to_notify(args.notify):
        print(f"  router {url}: {notify_router(url, token)}")
    return 0


def plan(store: Any, args: argparse.Namespace, by: str) -> Any:
    """The rollback on top of the route's newest snapshot, on the endpoints that answer; printed."""
    from rollback.plan import on_live_endpoints, plan_rollback

    generations = store.back(args.route)
    current = next(generations, None)
    planned = plan_rollback(_chain(current, generations) if current else iter(()), by=by, now=datetime.now(UTC))
    assert current is not None  # plan_rollback refused an empty route
    if planned.stable.fingerprint != current.stable.fingerprint:  # a revert: is anything there to land on?
        live = [url for url in planned.stable.endpoints if answers_health(url)]
        if args.force and not live:
            print(f"warning: no endpoint of {planned.stable.short} answers its health check; --force writes it")
        elif not args.force:
            for url in (url for url in planned.stable.endpoints if url not in live):
                print(f"  endpoint {url} does not answer its health check: left out")
            planned = on_live_endpoints(planned, live)
    print(f"route {args.route}: generation {current.generation} -> {planned.generation}")
    print(f"  stable    {current.stable.short} -> {planned.stable.short}")
    if current.candidate is not None:
        print(f"  candidate {current.candidate.short} at {current.candidate.weight_ppm} ppm -> removed")
    if current.shadow is not None:
        print(f"  shadow    {current.shadow.short} -> removed")
    return planned


def _chain(first: Any, rest: Any) -> Any:
    yield first
    yield from rest


def answers_health(url: str, timeout_s: float = 2.0) -> bool:
    """Whether the endpoint (a replica proxy, or vLLM itself) answers ``GET /health`` with 200."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as response:  # noqa: S310
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def routers_to_notify(flags: list[str]) -> list[str]:
    """The routers named on the command line and in the environment, each once."""
    named = [*flags, *os.environ.get(ROUTERS_ENV, "").split(",")]
    return list(dict.fromkeys(url.strip().rstrip("/") for url in named if url.strip()))


def notify_router(admin_url: str, token: str, timeout_s: float = 5.0) -> str:
    """Ask one router to re-read the route now; what it answered, or why it will only see it by polling.

    The rollback is committed already: a router that cannot be told is reported, never an error.
    """
    request = urllib.request.Request(  # noqa: S310 - the router's admin port
        f"{admin_url}/admin/notify", data=b"", headers={"Authorization": f"Bearer {token}"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            answer = json.loads(response.read())
    except (OSError, ValueError) as error:
        return f"not told ({error}); it picks the rollback up at its next poll of the store"
    return f"serving generation {answer.get('generation')} ({answer.get('result')})"
