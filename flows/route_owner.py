"""The flow's hold on its route: fenced writes and the lease heartbeat.

Every write goes through :class:`RouteOwner`, which commits only on top of the generation the
rollout last wrote itself. A write by anyone else ends the ownership for good: the owner refuses
every later write, and the flow stops. The :class:`Heartbeat` thread renews the candidate's and
shadow's leases through the same fence for as long as the flow's process lives; when the process
dies the leases run out and the routers send new requests to stable by themselves.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from revgate.flows import steps
from revgate.flows.spec import PromotionSpec
from revgate.manifests.errors import RevgateError
from revgate.manifests.route import RouteConflict, RouteSnapshot
from revgate.promotion.ownership import Takeover, lapsed_lease, takeover
from revgate.promotion.routes import renew_leases

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 5.0  # the cancel probe's time box per beat (never longer than the beat itself)
WATCH_EVERY_S = 5.0  # how often a heartbeat watches, unless told (the plan's watch_every_seconds)

Change = Callable[[RouteSnapshot], RouteSnapshot | None]


class RouteTakenOver(RevgateError):
    """Another writer committed the route during the rollout; the rollout stops and never writes it again."""

    def __init__(self, taken: Takeover, route: str) -> None:
        super().__init__(taken.reason, where=f"route {route!r}",
                         fix="The other writer's change stands; start a new rollout if the candidate should go on.")
        self.taken = taken


class RolloutStopped(RevgateError):
    """Something the heartbeat watches ended the rollout (a cancel, a dead candidate): traffic goes back to stable."""


class RolloutCancelled(RolloutStopped):
    """The rollout's flow run was cancelled (the Prefect UI's Cancel)."""


# A watch returns why the rollout must stop, or None while it may go on.
Watch = Callable[[], str | None]


class RouteOwner:
    """The generation this rollout last wrote, and the one door through which it writes."""

    def __init__(self, spec: PromotionSpec, generation: int) -> None:
        self.spec = spec
        self.generation = generation
        self.lost: Takeover | None = None
        self.lost_event = threading.Event()  # set once another writer took the route
        self.cancelled = threading.Event()  # set once the flow run was cancelled
        self.fault = ""  # why a watch stopped the rollout
        self.wake = threading.Event()  # any of these: a waiting flow stops waiting
        self._lock = threading.Lock()  # the heartbeat and the flow write one at a time
        self._unconfirmed: RouteSnapshot | None = None  # a write whose call failed: it may still have landed

    def cancel(self) -> None:
        """Mark the rollout cancelled; the flow notices at its next wait or step."""
        self.cancelled.set()
        self.wake.set()

    def stop(self, fault: str) -> None:
        """Mark the rollout stopped by a fault; the flow notices at its next wait or step."""
        self.fault = self.fault or fault
        self.wake.set()

    def stop_if_ended(self) -> None:
        """RouteTakenOver or RolloutCancelled once either happened; nothing while the rollout goes on."""
        if self.lost is not None or self.lost_event.is_set():
            self.check()
        if self.cancelled.is_set():
            raise RolloutCancelled(f"the rollout of route {self.spec.route!r} was cancelled", where="flow run",
                                   fix="Start a new rollout when the candidate should go on.")
        if self.fault:
            raise RolloutStopped(self.fault, where=f"route {self.spec.route!r}",
                                 fix="Read the reason; start a new rollout once it is fixed.")

    def read(self) -> RouteSnapshot:
        """The committed route."""
        return steps.current_route(self.spec)

    def check(self) -> RouteSnapshot:
        """The committed route, if it is still this rollout's; else RouteTakenOver."""
        with self._lock:
            return self._owned()

    def commit(self, change: Change) -> RouteSnapshot | None:
        """Apply ``change`` to the route this rollout wrote last and commit it with compare-and-swap."""
        with self._lock:
            current = self._owned()
            proposed = change(current)
            if proposed is None:
                return None
            try:
                steps.commit_route(self.spec, proposed)
            except RouteConflict:
                self._owned()  # someone wrote between our read and our write: that raises
                raise
            except Exception:
                self._unconfirmed = proposed  # every answer lost is not a write lost: the next read decides
                raise
            self.generation = proposed.generation
            return proposed

    def _owned(self) -> RouteSnapshot:
        if self.lost is not None:
            raise RouteTakenOver(self.lost, self.spec.route)
        current = steps.current_route(self.spec)
        self._confirm(current)
        taken = takeover(current, self.generation)
        if taken is not None:
            self.lost = taken
            self.lost_event.set()
            self.wake.set()
            raise RouteTakenOver(taken, self.spec.route)
        return current


    def _confirm(self, current: RouteSnapshot) -> None:
        """Take back a write whose call failed if it landed after all (a stalled store, lost answers):
        the generation holding exactly its bytes is this rollout's own, never another writer's."""
        written, self._unconfirmed = self._unconfirmed, None
        if written is None or current.generation < written.generation or self.generation != written.generation - 1:
            return
        if steps.route_generation(self.spec, written.generation) == written.canonical():
            log.warning("route %s: generation %d, whose write had no answer, landed: it is this rollout's own",
                        self.spec.route, written.generation)
            self.generation = written.generation


class Heartbeat:
    """A daemon thread renewing the candidate's and shadow's leases every ``period_s`` through the fence,
    and watching every ``watch_every_s`` (at least once a renewal) apart from it.

    Being a thread of the flow's process, it dies with it: a killed controller stops renewing, and
    the routers revert to stable within one lease. Once the rollout is cancelled or stopped by a
    fault it renews nothing more: where the flow cannot route back at once (it waits in an approval
    pause), the routers send the candidate's traffic to stable when its lease runs out.
    """

    def __init__(self, owner: RouteOwner, *, lease_seconds: int, period_s: float, by: str,
                 cancelled: Callable[[], bool] | None = None, watches: Sequence[Watch] = (),
                 watch_every_s: float = WATCH_EVERY_S) -> None:
        self.owner, self.lease_seconds, self.period_s, self.by = owner, lease_seconds, period_s, by
        self.watch_every_s = min(watch_every_s, period_s)
        self.cancelled = cancelled  # asked every watch_every_s: was the flow run cancelled?
        self.watches = tuple(watches)  # asked every watch_every_s: must the rollout stop?
        self.renewals = 0
        self.failing = 0  # beats in a row whose renewal failed
        self._stop = threading.Event()
        self._probe: threading.Thread | None = None
        # A copy of the caller's context: Prefect's settings and run context travel with it.
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._run,), name="revgate-lease-heartbeat",
                                        daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop renewing (the leases then run out unless the route no longer has any)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _renewed(self, current: RouteSnapshot) -> RouteSnapshot | None:
        if current.candidate is None and current.shadow is None:
            return None
        now = datetime.now(UTC)
        lapsed = lapsed_lease(current, now)
        if lapsed is not None:  # renewing would serve the candidate again, its gap unwatched: stop instead
            if not self.owner.fault:
                log.warning("the rollout stops: %s", lapsed)
            self.owner.stop(lapsed)
            return None
        return renew_leases(current, lease_seconds=self.lease_seconds, by=self.by, now=now)

    def beat(self) -> None:
        """One renewal (nothing to renew when the route has no candidate and no shadow, or once the
        rollout was cancelled or stopped by a fault)."""
        if self.owner.cancelled.is_set() or self.owner.fault:
            return  # the rollout is ending: its leases are left to run out, never renewed for a dead candidate
        if self.owner.commit(self._renewed) is not None:
            self.renewals += 1
        if self.failing:
            log.warning("lease renewal works again after %d failed beats", self.failing)
        self.failing = 0

    def _failed(self, error: Exception) -> None:
        """A renewal that failed: the first of a run with its traceback, the rest one line each, so an
        outage of the store reads as one event, not a wall of tracebacks."""
        self.failing += 1
        if self.failing == 1:
            log.exception("lease renewal failed; retrying every %g s", self.period_s)
        else:
            log.warning("lease renewal failed again (%d in a row): %s", self.failing, error)

    def _look(self) -> None:
        for watch in self.watches:
            try:
                fault = None if self.owner.fault else watch()
            except Exception as error:  # a watch that cannot look says nothing this beat; renewal is not its business
                log.warning("a replica watch failed this beat: %s", error)
                continue
            if fault:
                log.warning("the rollout stops: %s", fault)
                self.owner.stop(fault)

    def _probe_cancel(self) -> None:
        """Ask whether the run was cancelled, within a time box: a Prefect API that hangs or fails
        must never hold up the next renewal. One probe at a time; a hung one is left to finish."""
        if self.cancelled is None or self.owner.cancelled.is_set():
            return
        if self._probe is not None and self._probe.is_alive():
            return  # the last probe still has not answered
        answer: list[bool] = []

        def probe() -> None:
            try:
                answer.append(bool(self.cancelled and self.cancelled()))
            except Exception as error:  # the Prefect API is down: ask again next beat
                log.warning("cannot ask Prefect whether the run was cancelled (the leases are renewed anyway): %s",
                            error)

        self._probe = threading.Thread(target=contextvars.copy_context().run, args=(probe,),
                                       name="revgate-cancel-probe", daemon=True)
        self._probe.start()
        self._probe.join(min(self.watch_every_s, PROBE_TIMEOUT_S))
        if answer and answer[0]:
            log.warning("flow run cancelled: the rollout stops")
            self.owner.cancel()

    def _run(self) -> None:
        # Renewal first and on its own: whatever fails after it (the Prefect API, a replica watch)
        # cannot stop the leases being renewed. The watches keep their own, shorter, period.
        now = time.monotonic()
        next_beat, next_watch = now + self.period_s, now + self.watch_every_s
        while not self._stop.wait(max(0.0, min(next_beat, next_watch) - time.monotonic())):
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + self.period_s
                try:
                    self.beat()
                except RouteTakenOver as taken:
                    log.warning("lease heartbeat stops: %s", taken)
                    return
                except Exception as error:  # a store or router hiccup: the next beat tries again within the lease
                    self._failed(error)
            if now >= next_watch:
                next_watch = now + self.watch_every_s
                self._probe_cancel()
                self._look()
