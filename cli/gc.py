"""revgate command-line: ``gc``, the reaper: drain the replicas no route holds any more."""

from __future__ import annotations

import argparse
import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

DEFAULT_GRACE_S = 900.0  # a rollout's loading and a lease's tail; a candidate's load takes minutes on a GPU too
DEFAULT_HOLD_S = 3600.0  # RolloutPlan.rollback_window_seconds' default


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``gc``."""
    parser = subparsers.add_parser(
        "gc", help="drain replicas that no route snapshot names and no lease holds, after a grace period "
                   "(a killed controller's candidate, a dead window's old stable, a failed start's leftovers)")
    parser.add_argument("--routes", action="append", required=True, metavar="STORE",
                        help="a route store every route of which holds its replicas (repeatable: give every store "
                             "whose routes use these workers)")
    parser.add_argument("--worker", action="append", required=True, metavar="URL", help="a worker agent (repeatable)")
    parser.add_argument("--token-file", type=Path, required=True, help="file holding the workers' bearer token")
    parser.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S,
                        help=f"seconds a replica named nowhere is kept after its start or its lease's end "
                             f"(default {DEFAULT_GRACE_S:.0f})")
    parser.add_argument("--hold-s", type=float, default=DEFAULT_HOLD_S,
                        help="seconds a promotion's old stable is kept after the write that retired it: the "
                             f"rollback window, which keeps it ready (default {DEFAULT_HOLD_S:.0f}, the plans' "
                             "default window; give your longest)")
    parser.add_argument("--drain-grace-s", type=float, default=30.0,
                        help="seconds a reaped replica gets to finish the requests it holds (default 30)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be reaped, drain nothing")
    parser.add_argument("--json", action="store_true", help="print each reap as a JSON line")
    parser.set_defaults(func=run_gc)


def run_gc(args: argparse.Namespace) -> int:
    """List the left-over replicas with their reasons and drain them (unless --dry-run)."""
    from revgate.registry.route_store import open_route_store
    from revgate.rollback.reap import reapable, retired
    from revgate.serving.token_file import load_token
    from revgate.serving.worker.client import WorkerClient

    token = load_token(args.token_file, what="workers' token")
    now = datetime.now(UTC)
    since = now - timedelta(seconds=args.hold_s + args.grace_s)
    snapshots, retired_at = [], {}
    for url in args.routes:  # read before the workers: a replica started meanwhile is young, so kept
        store = open_route_store(url)
        for name in store.routes():
            newest_first = store.back(name)
            current = next(newest_first, None)
            if current is not None:
                snapshots.append(current)
                retired_at.update(retired(itertools.chain([current], newest_first), since=since))
    clients = {url.rstrip("/"): WorkerClient(url, token) for url in args.worker}
    views = {url: client.replicas() for url, client in clients.items()}
    reaps = reapable(views, snapshots, now=now, grace_s=args.grace_s, hold_s=args.hold_s, retired_at=retired_at)
    for reap in reaps:
        if not args.dry_run:
            clients[reap.worker].drain(reap.replica_id, args.drain_grace_s)
        print(json.dumps({**reap.record(), "drained": not args.dry_run}) if args.json else
              ("would " if args.dry_run else "") + reap.line())
    if not reaps and not args.json:
        print(f"nothing to reap: {sum(len(v) for v in views.values())} replica(s) on {len(views)} worker(s), "
              f"{len(snapshots)} route(s)")
    return 0
