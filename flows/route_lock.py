"""The route's lock: one rollout per route at a time, a one-slot Prefect global concurrency limit held
with a lease that this process renews itself.

Not Prefect's ``concurrency()`` context manager: its renewal thread gives up after three failed tries
(half a minute of a Prefect outage), and the slot is then gone for the rest of the rollout, so a
second rollout of the route could start. Here the keeper renews every third of the lease while Prefect
answers, asks every few seconds while it is away, and takes the slot again if its lease ended
meanwhile, saying so; if another rollout took it first, that is a decision: this rollout stops and
routes back to stable (the heartbeat watches the lock, :func:`taken_by_another`), and the route's
fence keeps either from writing over the other.

A Prefect server keeps leases in memory by default: restarted, it forgets them and the slot they held
stays counted for ever. ``flows.processes.prefect_server`` starts it with the file lease storage; a
production server wants the same setting (docs/promotion.md).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from typing import TypeVar
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import PrefectHTTPStatusError

from revgate.flows.outage import asking_once
from revgate.manifests.errors import RevgateError

log = logging.getLogger(__name__)
T = TypeVar("T")

LOCK_ACQUIRE_S = 60.0  # the longest a rollout waits for Prefect to answer its lock request
LOCK_RELEASE_S = 10.0  # the longest a decision waits for Prefect to take the route's lock back
LEASE_FLOOR_S = 60.0  # Prefect's shortest lease
AWAY_POLL_S = 2.0  # how often the keeper asks while Prefect is away
GONE = (404, 410)  # Prefect's answers for a lease it no longer has


class RolloutInProgress(RevgateError):
    """Another rollout holds the route's lock: one rollout per route at a time."""


class PrefectUnanswered(RevgateError):
    """Prefect did not answer the route lock's request in time: whether the route is free is unknown."""


def lock_name(route: str) -> str:
    """The global concurrency limit that serialises rollouts of one route."""
    return f"revgate-route-{route}"


def ensure_route_lock(route: str) -> None:
    """Create the route's one-slot limit if missing."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(lock_name(route))
        except Exception:  # prefect raises ObjectNotFound; any read failure means create
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=lock_name(route), limit=1))


def status_of(error: BaseException) -> int:
    """The HTTP status of a Prefect API error, 0 for anything else."""
    return error.response.status_code if isinstance(error, PrefectHTTPStatusError) else 0


def call_within(limit_s: float, name: str, call: Callable[[], T], *,
                too_late: Callable[[T], None] | None = None) -> list[T | BaseException]:
    """``call()`` in a thread of its own (in this context: Prefect's settings and run context live in context
    variables a new thread lacks), waited for at most ``limit_s``: ``[value]``, ``[error]``, or ``[]`` when it
    did not answer in time; a value that comes after that goes to ``too_late``."""
    answer: list[T | BaseException] = []
    gate = threading.Lock()  # the answer and the giving up are decided one at a time, never both
    waiting = [True]

    def run() -> None:
        try:
            result: T | BaseException = call()
        except BaseException as error:  # handed to the caller
            result = error
        with gate:
            if waiting[0]:
                answer.append(result)
                return
        if too_late is not None and not isinstance(result, BaseException):
            try:
                too_late(result)
            except Exception as error:  # nobody to hand it to: said, and the lease ends on its own
                log.warning("%s: a late answer could not be undone: %s", name, error)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), name=name, daemon=True)
    thread.start()
    thread.join(limit_s)
    with gate:
        waiting[0] = False
        return list(answer)


class RouteLock:
    """The route's slot, taken once (``take``) and kept until ``close`` by a daemon thread of this process."""

    def __init__(self, route: str, lease_s: float, *, say: Callable[[str], None] = log.warning) -> None:
        self.route, self.name, self.lease_s, self.say = route, lock_name(route), max(LEASE_FLOOR_S, lease_s), say
        self.lease_id: UUID | None = None
        self.taken_again = 0  # leases that ended while Prefect was away and were taken again
        self.lost = False  # another holder took the slot after this lease ended
        self.away = False
        self._mutex = threading.Lock()  # one keeper step or close at a time
        self._stop = threading.Event()
        self._keeper = threading.Thread(target=contextvars.copy_context().run, args=(self._keep,),
                                        name="revgate-route-lock", daemon=True)

    def take(self) -> RouteLock:
        """Take the slot: RolloutInProgress when another holder has it (Prefect's 423, and only that);
        PrefectUnanswered when Prefect gives no answer within ``LOCK_ACQUIRE_S``."""
        ensure_route_lock(self.route)
        self.lease_id = self._acquire_within(LOCK_ACQUIRE_S)
        self._keeper.start()
        return self

    def _acquire(self, client: SyncPrefectClient) -> UUID:
        try:
            response = client.increment_concurrency_slots_with_lease(
                names=[self.name], slots=1, mode="concurrency", lease_duration=self.lease_s)
        except PrefectHTTPStatusError as error:
            if status_of(error) == 423:
                raise RolloutInProgress(
                    f"route {self.route!r} already has a rollout in progress", where=self.name,
                    fix="Wait for it to finish or roll it back; one rollout per route at a time.") from None
            raise
        return UUID(response.json()["lease_id"])

    def _acquire_within(self, limit_s: float) -> UUID:
        """One request for the slot, waited for at most ``limit_s``; a grant that comes later is given back."""
        def acquire() -> UUID:
            with get_client(sync_client=True) as client:
                return self._acquire(client)

        def give_back(lease: object) -> None:  # nobody waits for it any more: rather than hold the route
            with get_client(sync_client=True) as client:
                client.release_concurrency_slots_with_lease(lease_id=lease)  # type: ignore[arg-type]

        answer = call_within(limit_s, "route-lock-take", acquire, too_late=give_back)
        if not answer:
            raise PrefectUnanswered(
                f"Prefect did not answer the request for route {self.route!r}'s lock within {limit_s:g} s",
                where=self.name,
                fix="Nothing was changed. Check the Prefect API (PREFECT_API_URL) and start the rollout again; a "
                    "grant that comes later is given back.")
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return answer[0]

    def _keep(self) -> None:
        wait = self.lease_s / 3
        while not self._stop.wait(wait):
            wait = self.lease_s / 3 if self.keep_once() else AWAY_POLL_S

    def keep_once(self) -> bool:
        """One renewal (or, the lease gone, one try to take the slot again); False while Prefect is away."""
        with self._mutex:
            if self.lease_id is None or self._stop.is_set():
                return True
            try:
                with asking_once() as client:
                    self._renew_or_take_again(client, self.lease_id)
            except Exception as error:  # Prefect away (or failing): the rollout goes on, asked again shortly
                if not self.away:
                    self.say(f"cannot renew the route lock {self.name} ({type(error).__name__}): the rollout goes "
                             f"on; asking every {AWAY_POLL_S:g} s")
                self.away = True
                return False
            if self.away:
                self.say(f"the Prefect API is back: the route lock {self.name} is "
                         f"{'held' if self.lease_id is not None else 'held by another rollout'}")
            self.away = False
            return True

    def _renew_or_take_again(self, client: SyncPrefectClient, lease: UUID) -> None:
        try:
            client.renew_concurrency_lease(lease_id=lease, lease_duration=self.lease_s)
            return
        except PrefectHTTPStatusError as error:
            if status_of(error) not in GONE:
                raise
        try:
            self.lease_id = self._acquire(client)
        except RolloutInProgress:
            self.lease_id, self.lost = None, True
            self.say(f"the route lock {self.name} lapsed and another rollout took it: this rollout stops and "
                     "routes back to stable")
            return
        self.taken_again += 1
        self.say(f"the route lock {self.name}'s lease ended while Prefect was away; taken again")

    def close(self) -> None:
        """Stop keeping the slot and give it back (a no-op the second time)."""
        self._stop.set()
        with self._mutex:
            lease, self.lease_id = self.lease_id, None
            if lease is not None:
                with get_client(sync_client=True) as client:
                    client.release_concurrency_slots_with_lease(lease_id=lease)


def taken_by_another(lock: RouteLock) -> Callable[[], str | None]:
    """A heartbeat watch: why the rollout must stop once another rollout took its lapsed route lock, else None."""

    def watch() -> str | None:
        if not lock.lost:
            return None
        return (f"the route lock {lock.name} lapsed while Prefect was away and another rollout of route "
                f"{lock.route!r} took it: this rollout stops and routes back to stable")

    return watch


def release_route_lock(lock: RouteLock, limit_s: float = LOCK_RELEASE_S) -> str:
    """Give the route's lock back, waiting at most ``limit_s`` for Prefect; "" once released, else why not.

    Prefect down or cut off must not hold back what follows a committed decision (the rollback
    window, the old stable's drain, the evidence run's close): a lock that is not given back ends
    with its lease, at most ``max(60, lease_seconds)`` later. Released twice, the second is a no-op.
    """
    answer = call_within(limit_s, "route-lock-release", lock.close)
    if not answer:
        return f"Prefect did not answer within {limit_s:g} s"
    error = answer[0]
    # Whatever Prefect's client raised, the lease still ends.
    return f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else ""
