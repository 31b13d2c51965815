"""The promotion's I/O steps as plain functions: pin, verify, capacity, load, isolated check, route.

The Prefect flow wraps each in a task; keeping them plain lets the command line and the tests
run any step without an orchestrator.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from revgate.flows.evidence import RecordSource
from revgate.flows.spec import PromotionSpec
from revgate.manifests.errors import RevgateError
from revgate.manifests.revision import ServiceRevision
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import serving_limits
from revgate.manifests.seam import Exchange, network
from revgate.promotion.capacity import (
    CapacityCheck,
    check_capacity,
    revisions_from_report,
    route_endpoints,
    stated_capacity,
)
from revgate.promotion.fleet import AgentSlots, merge_capacity, place_replicas, replica_count, routers_behind
from revgate.registry.compat import compatibility_problems, parse_model_config
from revgate.registry.route_store import open_route_store
from revgate.registry.signing import read_signed_files
from revgate.registry.store import open_store
from revgate.registry.verify import as_artifact_paths, check_signature_matches
from revgate.serving.router.admin_client import RouterAdmin
from revgate.serving.worker.artifact import trust_policy
from revgate.serving.worker.client import AgentEngine, WorkerClient, one_build
from revgate.serving.worker.request import ReplicaRequest
from revgate.serving.worker.views import ReplicaView

log = logging.getLogger(__name__)


class PromotionRefused(RevgateError):
    """A precondition of the promotion does not hold; nothing was loaded and no traffic moved."""


class RoutersBehind(RevgateError):
    """A committed generation is not served by every router within the spec's wait."""


ReplicaKey = tuple[str, str]  # (worker agent URL, replica id): ids are only unique on their own agent


def fleet_engine(spec: PromotionSpec) -> AgentEngine:
    """The engine build the fleet's agents run: the runtime ``e`` a revision started on them pins.

    The agents own the engine's identity; the controller (a CPU host, often) has no engine of its own
    to ask. Agents on different builds would run different revisions of one candidate: refused.
    """
    return one_build(fleet_engines(spec))


def fleet_engines(spec: PromotionSpec) -> list[AgentEngine]:
    """What every agent of the fleet says of its engine build (``GET /v1/engine``)."""
    return [client.engine() for client in fleet(spec)]


def check_fit(spec: PromotionSpec, revision: ServiceRevision, engines: Iterable[AgentEngine]) -> None:
    """Before any agent loads a byte: the revision's model config, execution and interface against what each
    agent's engine build says it can run. Only config.json comes here (checked against its manifest entry);
    each agent checks again, on the bytes it loads, where it loads them."""
    config = parse_model_config(open_store(spec.artifact_store).get_small_file(revision.artifact, "config.json"))
    for engine in engines:
        problems = compatibility_problems(config, revision.artifact, revision.execution, revision.interface,
                                          revision.adapter, engine=engine.can_run())
        if problems:
            found = "; ".join(f"{problem.field}: {problem.what}" for problem in problems)
            raise PromotionRefused(f"the candidate cannot run on agent {engine.url} ({engine.device}, "
                                   f"{engine.runtime.engine_distribution} {engine.runtime.engine_version}): {found}",
                                   where=problems[0].field, fix=problems[0].fix)


def pin(spec: PromotionSpec) -> tuple[ServiceRevision, AgentEngine]:
    """Resolve the candidate to its immutable documents: manifest by digest, the agents' engine build; and
    what the agents said of their engine (for the evidence)."""
    manifest = open_store(spec.artifact_store).get_manifest(spec.candidate_manifest)
    engine = fleet_engine(spec)
    revision = ServiceRevision(name=spec.candidate_name, artifact=manifest, runtime=engine.runtime,
                               execution=spec.execution, interface=spec.interface)
    return revision, engine


def replica_request(spec: PromotionSpec, revision: ServiceRevision) -> ReplicaRequest:
    """The worker's start request for the candidate."""
    return ReplicaRequest(revision=revision, store=spec.artifact_store, signature_policy=spec.signature, warm=spec.warm)


def verify(spec: PromotionSpec, revision: ServiceRevision, scratch: Path) -> dict[str, float]:
    """The pinned manifest and its signature, here, before any worker loads a byte: the signer is one the
    policy trusts and every signed file and digest is the manifest's.

    No weights come to the controller: each agent fetches the bytes it loads, re-hashes them against this
    manifest and checks them against its own engine's capabilities (serving/worker/artifact.py).
    """
    started = time.monotonic()
    digest = revision.artifact.digest
    signature = open_store(spec.artifact_store).get_signature(digest)
    if signature is None:
        raise PromotionRefused(f"artifact {digest} has no signature in the store", where=spec.artifact_store,
                               fix="Sign the artifact and push its signature (revgate artifacts sign, push).")
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / f"{digest.removeprefix('sha256:')}.sig"
    path.write_bytes(signature)
    signed = read_signed_files(path, trust_policy(spec.signature))
    files = as_artifact_paths(signed.files, [entry.path for entry in revision.artifact.entries], path)
    check_signature_matches(files, revision.artifact, path)
    return {"verify_s": time.monotonic() - started}


def current_route(spec: PromotionSpec) -> RouteSnapshot:
    """The committed route; a promotion needs a stable revision to compare against and fall back to."""
    snapshot = open_route_store(spec.route_store).read(spec.route)
    if snapshot is None:
        raise PromotionRefused(
            f"route {spec.route!r} has no snapshot", where=spec.route_store,
            fix="Create the route with its stable revision first (revgate route set).",
        )
    return snapshot


def other_routes(spec: PromotionSpec) -> list[RouteSnapshot] | None:
    """The current snapshots of the route store's other routes; None when one cannot be read (then a
    replica that one of them may serve is not known to be free)."""
    store = open_route_store(spec.route_store)
    try:
        snapshots = [store.read(name) for name in store.routes() if name != spec.route]
    except RevgateError as error:
        log.warning("cannot read every route of %s (%s): replicas they may share are kept", spec.route_store, error)
        return None
    return [snapshot for snapshot in snapshots if snapshot is not None]


def worker(spec: PromotionSpec, url: str | None = None, timeout_s: float = 30.0) -> WorkerClient:
    """A client for one worker agent of the fleet (default: the spec's first)."""
    return WorkerClient(url or spec.worker_url, Path(spec.worker_token_file).read_text(encoding="utf-8").strip(),
                        timeout_s=timeout_s)


def fleet(spec: PromotionSpec) -> list[WorkerClient]:
    """Clients for every worker agent of the spec."""
    return [worker(spec, url) for url in spec.workers()]


def record_source(spec: PromotionSpec) -> RecordSource:
    """The route's one evidence source: every named router's records in the record sink."""
    return RecordSource(spec.records_sink, spec.route, spec.record_signers)


def capacity(spec: PromotionSpec, shares: dict[str, float], targets: Iterable[RevisionTarget]) -> CapacityCheck:
    """The capacity rule for ``shares`` (revision -> fraction of traffic) on the ready replicas of ``targets``.

    Only the replicas the route sends to count (the targets' endpoints): a ready orphan, or another
    route's replica of the same revision, carries none of this route's traffic. Demand is every
    router's, from the record sink.
    """
    counted = route_endpoints(*((target.fingerprint, target.endpoints) for target in targets))
    ready = merge_capacity([revisions_from_report(client.capacity().model_dump(), counted) for client in fleet(spec)])
    if spec.plan.replica_capacity_rps is not None:
        ready = stated_capacity(ready, float(spec.plan.replica_capacity_rps))
    demand = record_source(spec).demand(time.time())
    return check_capacity(shares, ready, demand_rps=demand.rps, target_utilisation=float(spec.plan.target_utilisation),
                          demand_unknown=demand.unavailable)


def check_stable_capacity(spec: PromotionSpec, stable: RevisionTarget) -> dict[str, Any]:
    """Stable must carry all the traffic before anything is loaded (loading, warming, draining do not count)."""
    check = capacity(spec, {stable.fingerprint: 1.0}, [stable])
    if not check.ok:
        raise PromotionRefused(
            f"stable cannot carry the route's traffic on {', '.join(spec.workers())}: {check.reason}",
            where="capacity", fix="Restore stable capacity before starting a rollout.",
        )
    return check.evidence()


def start_replica(client: WorkerClient, request: ReplicaRequest, timeout_s: float = 600) -> ReplicaView:
    """Start, verify, load and warm a replica on the worker; its view once ready, else the worker's reason."""
    replica = client.start(request)
    view = client.wait_for(replica.replica_id, {"ready"}, timeout_s)
    return ready_view(client, view, f"replica of {request.revision.name or request.revision.short}")


def start_candidates(spec: PromotionSpec, revision: ServiceRevision) -> list[ReplicaView]:
    """Start the plan's candidate replicas, spread over the fleet's agents; their views (state ``created``),
    each with the ``worker_url`` it runs on. They load in parallel, each on its own agent."""
    return start_spread(fleet(spec), replica_request(spec, revision), spec.plan.candidate_replicas)


def start_spread(clients: Iterable[WorkerClient], request: ReplicaRequest, count: int | None) -> list[ReplicaView]:
    """Start ``count`` replicas of the request's revision (None: promotion.fleet.replica_count), the freest agents first
    (promotion.fleet); their views (state ``created``), each with the ``worker_url`` it runs on."""
    by_url = {client.url: client for client in clients}
    agents = [AgentSlots(url, client.capacity().free_slots) for url, client in by_url.items()]
    return [by_url[url].start(request) for url in place_replicas(agents, replica_count(count, agents))]


def wait_ready(spec: PromotionSpec, replica: ReplicaView, timeout_s: float = 600) -> ReplicaView:
    """The started replica's view once ready (with its ``worker_url``), else PromotionRefused with the reason."""
    client = worker(spec, replica.worker_url or None)
    view = client.wait_for(replica.replica_id, {"ready"}, timeout_s)
    return ready_view(client, view, f"replica {replica.replica_id}")


def ready_view(client: WorkerClient, view: ReplicaView, what: str) -> ReplicaView:
    """``view`` if its replica is ready, else PromotionRefused with the worker's reason."""
    if view.state != "ready":
        raise PromotionRefused(
            f"{what} ended {view.state}: {view.reason}",
            where=client.url, fix="Read the replica's reason in the worker's log; nothing was routed to it.",
        )
    return view


def _post(url: str, body: dict[str, Any], timeout_s: float = 60) -> tuple[int, bytes]:
    """One POST to the replica's own endpoint, through the seam's transport: its status and body."""
    answer = network(Exchange("POST", url, json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout_s)
    return answer.status, answer.body


def isolated_check(endpoint: str, model: str) -> dict[str, float]:
    """Completion and streaming against the candidate alone, off the live path."""
    started = time.monotonic()
    status, body = _post(f"{endpoint}/v1/completions", {"model": model, "prompt": "add 1+2=", "max_tokens": 4})
    if status != 200 or not json.loads(body).get("choices"):
        raise PromotionRefused(f"candidate completion failed with {status}", where=endpoint, fix="Inspect the replica.")
    status, body = _post(
        f"{endpoint}/v1/completions", {"model": model, "prompt": "rev abc=", "max_tokens": 4, "stream": True}
    )
    if status != 200 or not body.rstrip().endswith(b"data: [DONE]"):
        raise PromotionRefused("candidate stream did not end with [DONE]", where=endpoint, fix="Inspect the replica.")
    return {"isolated_check_s": time.monotonic() - started}


def candidate_target(views: list[ReplicaView], revision: ServiceRevision) -> RevisionTarget:
    """The route target for the candidate's ready replica views: every one of their endpoints, and the limits
    of its interface policy, which the routers enforce."""
    return RevisionTarget(fingerprint=revision.fingerprint, endpoints=tuple(view.endpoint for view in views),
                          served_model=views[0].served_model, limits=serving_limits(revision.interface))


def failure_domains(views: list[ReplicaView]) -> dict[str, str]:
    """Each candidate endpoint's failure domain: the host of the worker agent that runs it.

    Replicas on one host fail together (its power, its network, its agent); the routers retry a
    failed request on another domain first (serving/router/split.py: retry_order).
    """
    return {view.endpoint: urlsplit(view.worker_url).hostname or view.worker_url for view in views}


def router_admin(spec: PromotionSpec, admin_url: str) -> RouterAdmin:
    """A client for one of the spec's routers' admin port."""
    return RouterAdmin.from_token_file(admin_url, spec.router_admin_token_file)


def route_generation(spec: PromotionSpec, generation: int) -> bytes | None:
    """The committed bytes of the route's ``generation`` (None when it was never committed)."""
    for snapshot in open_route_store(spec.route_store).back(spec.route):
        if snapshot.generation <= generation:
            return snapshot.canonical() if snapshot.generation == generation else None
    return None


def commit_route(spec: PromotionSpec, snapshot: RouteSnapshot) -> None:
    """Compare-and-swap the snapshot into the store, then tell every router to read it now.

    A router that misses the notify still polls the store; :func:`await_routers` waits for it.
    """
    open_route_store(spec.route_store).write(snapshot)
    for admin_url in spec.routers():
        with contextlib.suppress(OSError, RevgateError):  # one that is not told reads it at its next poll
            router_admin(spec, admin_url).notify()


def served_generations(spec: PromotionSpec) -> dict[str, int | None]:
    """The generation each router serves now (None: it does not answer)."""
    served: dict[str, int | None] = {}
    for admin_url in spec.routers():
        try:
            health = router_admin(spec, admin_url).health()
        except (OSError, RevgateError):
            served[admin_url] = None
            continue
        if health.store_regressed:
            # It serves a generation the store no longer has: not the route the flow wrote, whatever its number.
            log.warning("router %s: %s", admin_url, health.store_regressed.get("message"))
            served[admin_url] = None
            continue
        served[admin_url] = health.generation
    return served


def await_routers(spec: PromotionSpec, generation: int) -> dict[str, int | None]:
    """Wait until every router serves ``generation`` (or later); RoutersBehind after ``router_sync_s``."""
    deadline = time.monotonic() + spec.router_sync_s
    while behind := routers_behind(served := served_generations(spec), generation):
        if time.monotonic() >= deadline:
            named = ", ".join(f"{url} serves {seen if seen is not None else 'nothing (no answer)'}"
                              for url, seen in behind.items())
            raise RoutersBehind(f"generation {generation} of route {spec.route!r} is not served by every router: "
                                f"{named}", where="route routers",
                                fix="Check those routers' store access and logs; the rollout stops here.")
        time.sleep(0.25)
    return served


def replicas_serving(spec: PromotionSpec, endpoints: tuple[str, ...]) -> dict[ReplicaKey, str]:
    """Live replicas on the fleet behind ``endpoints``: (worker, replica id) -> endpoint."""
    wanted = {url.rstrip("/") for url in endpoints}
    return {(client.url, r.replica_id): r.endpoint.rstrip("/")
            for client in fleet(spec) for r in client.replicas() if r.live and r.endpoint.rstrip("/") in wanted}


def drain_replica(spec: PromotionSpec, key: ReplicaKey, grace_s: float = 30) -> bool:
    """Drain one replica on its worker (a replica already gone is fine); whether a drain was started."""
    client = worker(spec, key[0])
    if not client.replica(key[1]).live:
        return False
    client.drain(key[1], grace_s)
    return True


WATCH_ASK_S = 5.0  # the longest one look at one agent may take: a host cut off must not hold the heartbeat


def replica_view(spec: PromotionSpec, key: ReplicaKey) -> ReplicaView:
    """One candidate replica as its agent reports it, asked within :data:`WATCH_ASK_S` (raises when it cannot be)."""
    worker_url, replica_id = key
    return worker(spec, worker_url, timeout_s=min(WATCH_ASK_S, spec.plan.renew_every_s)).replica(replica_id)


class CandidateWatch:
    """Whether the rollout's candidate replicas can still serve, asked of their agents once per heartbeat.

    A replica its agent reports failed or terminated stops the rollout at once. An agent that cannot be
    asked (its host down or cut off) is no verdict on its own: the candidate may still serve through the
    others. But once no candidate replica has been confirmed ready for ``silence_s`` (every agent that
    holds one silent, or its replicas gone), the rollout stops too: a candidate nobody can see serving
    is not one to promote, and its traffic has been going to stable since the routers ejected it.
    """

    def __init__(self, keys: Iterable[ReplicaKey], silence_s: float, ask: Callable[[ReplicaKey], ReplicaView],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keys, self.silence_s, self.ask, self.clock = tuple(keys), silence_s, ask, clock
        self.confirmed_at = clock()  # loaded and warmed just now

    def __call__(self) -> str | None:
        now, silent, confirmed = self.clock(), [], False
        for worker_url, replica_id in self.keys:
            try:
                view = self.ask((worker_url, replica_id))
            except (OSError, RevgateError):
                silent.append(worker_url)
                continue
            if view.state == "ready":
                confirmed = True
                continue
            message = view.failure.message if view.failure is not None else ""
            return f"candidate replica {replica_id} on {worker_url} is {view.state}: {message}".strip(": ")
        if confirmed:
            self.confirmed_at = now
            return None
        unseen_s = now - self.confirmed_at
        if unseen_s < self.silence_s:
            return None
        return (f"no candidate replica confirmed ready for {unseen_s:.0f} s (limit {self.silence_s:.0f} s): "
                f"{', '.join(sorted(set(silent)))} did not answer")


def replicas_in_flight(spec: PromotionSpec, endpoints: tuple[str, ...]) -> dict[str, int | None]:
    """Requests each replica behind ``endpoints`` holds now, as its agent counts them (None: not found)."""
    held: dict[str, int | None] = {url.rstrip("/"): None for url in endpoints}
    for client in fleet(spec):
        for view in client.replicas():
            endpoint = view.endpoint.rstrip("/")
            if endpoint in held and view.live:
                held[endpoint] = view.in_flight
    return held


def await_idle_replicas(spec: PromotionSpec, endpoints: tuple[str, ...], limit_s: float = 60.0,
                        every_s: float = 0.25, quiet_polls: int = 2) -> dict[str, Any]:
    """Wait until every replica has held no request for ``quiet_polls`` polls in a row.

    A stage starts counting only once the previous stage's work (the mirror's copies, the last probes)
    has left both arms, so its first look is not taken inside that backlog. The agents' count of the
    requests each engine holds says so (every request reaches an engine through its replica's
    admission), not a sleep. Gives up after ``limit_s`` and says which replicas were still busy; an
    endpoint no agent of the spec serves cannot be watched and is named as such.
    """
    started = time.monotonic()
    held = replicas_in_flight(spec, endpoints)
    unwatched = sorted(url for url, count in held.items() if count is None)  # served by no agent of the spec
    quiet = {url: 0 for url, count in held.items() if count is not None}
    last: dict[str, int | None] = {}
    while any(count < quiet_polls for count in quiet.values()):
        last = replicas_in_flight(spec, tuple(quiet))
        quiet = {url: quiet[url] + 1 if last.get(url) == 0 else 0 for url in quiet}
        if time.monotonic() - started >= limit_s:
            busy = {url: last.get(url) for url, count in quiet.items() if count < quiet_polls}
            return {"idle": False, "waited_s": round(time.monotonic() - started, 2), "busy": busy,
                    "unwatched": unwatched}
        time.sleep(every_s)
    return {"idle": True, "waited_s": round(time.monotonic() - started, 2), "busy": {}, "unwatched": unwatched}
