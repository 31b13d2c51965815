"""Landing a rollback on the route store: planned on the newest generation, on endpoints that answer,
planned again on top of a concurrent write. The one procedure behind ``revgate rollback`` and the
Prefect ``rollback`` deployment.

The store and the health probe are given (this package imports only manifests): it works with
Prefect and MLflow down.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from revgate.manifests.route import RouteConflict, RouteSnapshot, RouteStore
from revgate.rollback.plan import on_live_endpoints, plan_rollback, serving_on

CONFLICT_ATTEMPTS = 5  # planned again on top of a concurrent write (a live heartbeat's), this many times at most
BACKOFF_S = (0.0, 0.05, 0.1, 0.2, 0.4)  # before each attempt: bounded, and short next to any lease renewal


Restore = Callable[[RouteSnapshot], Sequence[str]]  # start the planned stable's replicas; their ready endpoints


def planned_on(
    store: RouteStore, route: str, *, by: str, now: Callable[[], datetime], answers: Callable[[str], bool],
    force: bool = False, say: Callable[[str], None] = print, restore: Restore | None = None,
) -> RouteSnapshot:
    """The rollback on top of the route's newest snapshot, reading the history only as far as it needs.

    A revert (another stable) keeps only the endpoints ``answers`` says are up. When none is, ``restore``
    (given) starts replicas of that revision, verified and warmed, and the rollback lands on them once
    they are ready; without it the rollback is refused (NoLiveStable), unless ``force``. Aborting a
    canary keeps the stable serving now.
    """
    generations = store.back(route)
    current = next(generations, None)
    planned = plan_rollback(itertools.chain([current], generations) if current else iter(()), by=by, now=now())
    assert current is not None  # plan_rollback refused an empty route
    if planned.stable.fingerprint != current.stable.fingerprint:
        live = [url for url in planned.stable.endpoints if answers(url)]
        if not live and not force and restore is not None:
            say(f"no endpoint of {planned.stable.short} answers its health check: starting replicas of it "
                "through the agents (verified and warmed like a candidate; the route moves once they are ready)")
            planned = serving_on(planned, list(restore(planned)))
            live = list(planned.stable.endpoints)
        if force and not live:
            say(f"warning: no endpoint of {planned.stable.short} answers its health check; --force writes it")
        elif not force:
            for url in (url for url in planned.stable.endpoints if url not in live):
                say(f"  endpoint {url} does not answer its health check: left out")
            planned = on_live_endpoints(planned, live)
    say(f"route {route}: generation {current.generation} -> {planned.generation}")
    say(f"  stable    {current.stable.short} -> {planned.stable.short}")
    if current.candidate is not None:
        say(f"  candidate {current.candidate.short} at {current.candidate.weight_ppm} ppm -> removed")
    if current.shadow is not None:
        say(f"  shadow    {current.shadow.short} -> removed")
    return planned


def land(store: RouteStore, route: str, *, by: str, now: Callable[[], datetime], answers: Callable[[str], bool],
         force: bool = False, say: Callable[[str], None] = print, restore: Restore | None = None,
         pause: Callable[[float], None] = time.sleep) -> RouteSnapshot:
    """Plan and commit the rollback (compare-and-swap), planning again on top of a concurrent write after
    a bounded, jittered backoff (replicas ``restore`` started are started once, and answer from then on)."""
    started: dict[str, list[str]] = {}

    def restore_once(planned: RouteSnapshot) -> list[str]:
        assert restore is not None
        if planned.stable.fingerprint not in started:
            started[planned.stable.fingerprint] = list(restore(planned))
        return started[planned.stable.fingerprint]

    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        if BACKOFF_S[attempt - 1]:  # jitter: two rollbacks racing each other do not retry in step
            pause(BACKOFF_S[attempt - 1] * random.uniform(0.5, 1.0))  # noqa: S311 - not a secret
        planned = planned_on(store, route, by=by, now=now, answers=answers, force=force, say=say,
                             restore=restore_once if restore is not None else None)
        try:
            store.write(planned)
            return planned
        except RouteConflict:
            if attempt == CONFLICT_ATTEMPTS:
                raise
            say(f"the route changed during the rollback (attempt {attempt}); planning again on the new generation")
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises
