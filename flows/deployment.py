"""The flows behind the ``promote-revision`` and ``rollback-route`` deployments (prefect.yaml).

Their parameters are what a person chooses on the Prefect UI's Run form: a route, a candidate, a
gate policy and a plan by name. The site configuration (``flows.site``) on the worker's host
supplies everything else, the approval mode among it: whoever may start a run cannot skip its
approvals. ``promote`` runs the same rollout as ``promote_revision``,
in this flow run, so the approval form and the evidence run's Prefect link are this run's.
"""

from __future__ import annotations

import getpass
from datetime import UTC, datetime
from functools import partial

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.runtime import flow_run
from prefect.states import Completed, Failed

from revgate.flows.promote import promote_revision
from revgate.flows.restore import restorer
from revgate.flows.route_lock import RolloutInProgress
from revgate.flows.site import RouteSite, SiteConfigInvalid, load_site, promotion_spec, site_path
from revgate.flows.spec import PromotionSpec
from revgate.manifests.errors import RevgateError
from revgate.registry.errors import ObjectMissing
from revgate.registry.follow import follow_in_ledger
from revgate.registry.route_store import open_route_store
from revgate.registry.store import open_store
from revgate.rollback.land import land
from revgate.serving.router.admin_client import RouterAdmin
from revgate.serving.worker.engine import answers_health

DECISION = "decision: "  # a finished promotion's state message: "decision: promoted"
REFUSED = "refused: "  # a promotion refused before it started: another rollout holds the route


class CandidateMissing(RevgateError):
    """The candidate's manifest is not in the route's artifact store."""


def requester(requested_by: str) -> str:
    """Who the audit trail names: the flow run, and the person the Run form gave, marked as claimed.

    Prefect's server does not know who clicked Run (it has no users), so a name typed on the form is
    only a claim; the audit trail says so rather than take it as the author of the route's generations.
    """
    run = f"prefect flow run {flow_run.get_name() or getpass.getuser()}"
    claimed = requested_by.strip()
    return f"{claimed} (claimed; {run})" if claimed else run


def check_candidate(spec: PromotionSpec) -> None:
    """The candidate's manifest must be in the artifact store, before the route is locked or evidence opened."""
    try:
        open_store(spec.artifact_store).get_manifest(spec.candidate_manifest)
    except ObjectMissing:
        raise CandidateMissing(
            f"candidate {spec.candidate_manifest} is not in the artifact store", where=spec.artifact_store,
            fix="Push the artifact (revgate push) or check the digest and the route's artifact_store.",
        ) from None


@flow(name="promote", log_prints=True)
def promote(
    route: str, candidate: str, policy: str = "", plan: str = "", requested_by: str = "",
) -> State[str]:
    """Roll a candidate out on a route with a gate policy and a plan named in the site configuration.

    The decision (promoted, rolled_back, failed) is the final state's message.

    Args:
        route: The route to roll the candidate out on, as the site configuration names it.
        candidate: The candidate: its pinned artifact manifest digest (sha256:...) or a candidate name
            listed under the route's candidates in the site configuration.
        policy: Gate policy by name (the site configuration's policies); empty: the route's default.
        plan: Rollout plan by name (the site configuration's plans); empty: the route's default.
        requested_by: Who asks for this rollout, for the audit trail (recorded as claimed: the server
            does not know who clicked).
    """
    logger = get_run_logger()
    site = load_site(site_path())
    spec = promotion_spec(site, route, candidate, policy=policy, plan=plan, created_by=requester(requested_by))
    logger.info("route %s: candidate %s %s, policy %s, plan %s, approval %s (the site's)", route,
                spec.candidate_manifest, spec.candidate_name, policy or site.routes[route].policy,
                plan or site.routes[route].plan, spec.approval)
    check_candidate(spec)
    try:
        decision = promote_revision.fn(spec)
    except RolloutInProgress as refused:
        logger.error("%s", refused)
        return Failed(message=f"{REFUSED}{refused}")
    logger.info("decision: %s", decision)
    return Completed(message=f"{DECISION}{decision}", data=decision)


@flow(name="rollback", log_prints=True)
def rollback(route: str, requested_by: str = "", start_replicas: bool = True) -> str:
    """Return a route to its last known good revision and tell its router; a canary or shadow is removed first.

    Args:
        route: The route to roll back, as the site configuration names it.
        requested_by: Who rolls back, for the audit trail.
        start_replicas: When no replica of the revision returned to answers (drained after the window),
            start them through the agents, verified and warmed, and move the route once they are ready.
            Off: refuse, naming what is missing.
    """
    logger = get_run_logger()
    site = load_site(site_path())
    if route not in site.routes:
        raise SiteConfigInvalid(f"no route named {route!r}", where="site configuration: routes",
                                fix=f"Name one the site configuration has: {', '.join(sorted(site.routes))}.")
    settings = site.routes[route]
    store = open_route_store(settings.route_store)
    # The same rules as `revgate rollback`: onto endpoints that answer, planned again on a concurrent write.
    say = partial(logger.info, "%s")
    planned = land(store, route, by=f"{requester(requested_by)} (rollback)", now=lambda: datetime.now(UTC),
                   answers=answers_health, say=say, restore=restorer(settings, say) if start_replicas else None)
    told = "; ".join(f"router {url} {notify_router(settings, url)}"
                     for url in dict.fromkeys((settings.router_admin_url, *settings.more_routers)))
    summary = f"route {route}: generation {planned.generation}, stable {planned.stable.short}; {told}"
    logger.info("%s", summary)
    logger.info("%s", follow_in_ledger(settings.tracking_uri, settings.registered_model or route, planned))
    return summary


def notify_router(settings: RouteSite, admin_url: str, timeout_s: float = 5.0) -> str:
    """Ask one of the route's routers to re-read the route now; a router not told picks it up at its next poll."""
    try:  # the rollback is committed already: a router that cannot be told is reported, never an error
        answer = RouterAdmin.from_token_file(admin_url, settings.router_admin_token_file, timeout_s=timeout_s).notify()
    except (OSError, RevgateError) as error:
        return f"not told ({error}); it picks the rollback up at its next poll of the store"
    return f"serving generation {answer.generation}"
