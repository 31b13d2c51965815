"""Rollback planning: the snapshot that returns a route to its last known good revision.

Needs only the route history, so it works from the command line with Prefect and MLflow down.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from manifests.errors import RevgateError
from manifests.route import RouteSnapshot
from manifests.route_change import as_target, successor


class NothingToRollBack(RevgateError):
    """The route has no candidate, no shadow, and no earlier stable revision to return to."""


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
    if not history:
        raise NothingToRollBack("the route has no snapshots", fix="Check the route name and the store URL.")
    current = history[-1]
    if current.candidate is not None or current.shadow is not None:
        return successor(current, by=by, now=now, candidate=None, shadow=None)
    good = last_known_good(history)
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
                     failure_domains=domains)
