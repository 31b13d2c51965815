"""Rollback planning: the snapshot that returns a route to its last known good revision.

Needs only the route history, so it works from the command line with Prefect and MLflow down.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from revgate.manifests.errors import RevgateError
from revgate.manifests.route import RouteSnapshot
from revgate.manifests.route_change import as_target, stable_domains, successor


class NothingToRollBack(RevgateError):
    """The route has no candidate, no shadow, and no earlier stable revision to return to."""


class NoLiveStable(RevgateError):
    """None of the endpoints the rollback would send traffic to answers: it would land on nothing."""


def last_known_good(history: Sequence[RouteSnapshot]) -> RouteSnapshot | None:
    """The newest earlier generation whose stable revision differs from the current stable."""
    if not history:
        return None
    current = history[-1].stable.fingerprint
    return next((snap for snap in reversed(history[:-1]) if snap.stable.fingerprint != current), None)


def rollback_snapshot(history: Sequence[RouteSnapshot], *, by: str, now: datetime) -> RouteSnapshot:
    """The successor that stops a rollout (drop candidate and shadow) or reverts the last promotion.

    An in-flight canary is aborted first: routing back to stable is the rollback, not a redeploy.
    With no canary, the stable revision returns to the last known good one.
    """
    return plan_rollback(reversed(history), by=by, now=now)


def plan_rollback(newest_first: Iterable[RouteSnapshot], *, by: str, now: datetime) -> RouteSnapshot:
    """:func:`rollback_snapshot` from the history newest first, read only as far as the plan needs:
    the current generation to abort a canary, back to the last different stable to revert."""
    generations = iter(newest_first)
    current = next(generations, None)
    if current is None:
        raise NothingToRollBack("the route has no snapshots", fix="Check the route name and the store URL.")
    if current.candidate is not None or current.shadow is not None:
        # The rollout's secrets end with it: its probe credential no longer declares evidence.
        return successor(current, by=by, now=now, candidate=None, shadow=None, cohort_secret="", probe_credential="",
                         failure_domains=stable_domains(current))
    good = next((snap for snap in generations if snap.stable.fingerprint != current.stable.fingerprint), None)
    if good is None:
        raise NothingToRollBack(
            f"route {current.route!r} at generation {current.generation} has only ever served one revision",
            where=current.route,
            fix="There is nothing earlier to return to; deploy a fixed revision instead.",
        )
    return revert_to(current, good, by=by, now=now)


def revert_to(current: RouteSnapshot, good: RouteSnapshot, *, by: str, now: datetime) -> RouteSnapshot:
    """The successor of ``current`` that serves ``good``'s stable revision alone, on its endpoints."""
    domains = {url: domain for url, domain in good.failure_domains.items() if url in good.stable.endpoints}
    return successor(current, by=by, now=now, stable=as_target(good.stable), candidate=None, shadow=None,
                     failure_domains=domains, cohort_secret="", probe_credential="")


def on_live_endpoints(planned: RouteSnapshot, live: Iterable[str]) -> RouteSnapshot:
    """``planned`` with its stable serving only the endpoints in ``live``; NoLiveStable when none is.

    A rollback onto a revision whose replicas were drained (after the window) or whose endpoints
    are reused by another process would send every request to nothing: the seeds say it plainly,
    a deleted or cooled stable does not restore capacity.
    """
    alive = [url for url in planned.stable.endpoints if url in set(live)]
    if not alive:
        raise NoLiveStable(
            f"no endpoint of revision {planned.stable.short} answers its health check "
            f"({', '.join(planned.stable.endpoints)}): the rollback would land on nothing",
            where=f"route {planned.route!r}, generation {planned.generation}",
            fix="Start replicas of that revision first (or give --force to write the rollback anyway).",
        )
    if len(alive) == len(planned.stable.endpoints):
        return planned
    return serving_on(planned, alive)


def serving_on(planned: RouteSnapshot, endpoints: Sequence[str]) -> RouteSnapshot:
    """``planned`` with its stable revision on ``endpoints`` (some of its own, or replicas started anew)."""
    stable = planned.stable.model_copy(update={"endpoints": tuple(endpoints)})
    domains = {url: domain for url, domain in planned.failure_domains.items() if url in endpoints}
    return RouteSnapshot.model_validate(planned.model_copy(update={"stable": stable, "failure_domains": domains})
                                        .model_dump())
