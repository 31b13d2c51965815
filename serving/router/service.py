"""The router: an OpenAI-compatible proxy that pins each request to one route snapshot.

The current snapshot lives in one attribute (``self.route``). A refresh validates a new snapshot,
compiles it, and replaces that reference; a request reads it exactly once at entry, so a swap only
affects later requests. Everything per request (canary assignment, retries, the response headers
naming revision and generation, the records) follows from that one read.

This module is the request path and the snapshot it reads. Its parts live beside it: the call's
state (call.py), labels and records (evidence.py), shadow copies (shadow_dispatch.py), the admin
port (admin.py) and the configuration (config.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import Coroutine
from typing import Any

from revgate.evaluation.records import CALLER_DEADLINE, ROUTE_DEADLINE, Outcome
from revgate.manifests.errors import ManifestInvalid
from revgate.manifests.route import RouteSnapshot, RouteStore
from revgate.serving.router.admin import AdminApi
from revgate.serving.router.call import Call
from revgate.serving.router.config import RouterConfig, check_config
from revgate.serving.router.deadlines import Deadlines
from revgate.serving.router.ejection import Ejections
from revgate.serving.router.evidence import RECORD_KEYS, REPLAY_ONLY_KEYS, Recorder, RecordOutlets, declared_labels
from revgate.serving.router.http import NO_ROUTE, Request, ServerConnection, error_body, serve
from revgate.serving.router.ids import RequestIds, bad_id, caller_text
from revgate.serving.router.limits import Watchdog
from revgate.serving.router.metrics import RouterMetrics
from revgate.serving.router.parse import drop_evidence_metadata, parse_body, upstream_body
from revgate.serving.router.relay import Relay
from revgate.serving.router.shadow_dispatch import ShadowDispatch
from revgate.serving.router.split import PinnedRoute, Target, compile_route, retry_order
from revgate.serving.router.upstream import Address, UpstreamConnection, UpstreamError, UpstreamPool, request_bytes

# What other code imports from here: the parts that moved out are re-exported, so it need not know.
__all__ = ["MAX_TIMEOUT_DIGITS", "RECORD_KEYS", "REPLAY_ONLY_KEYS", "Router", "RouterConfig", "check_config",
           "run_router"]

log = logging.getLogger("revgate.router")

PROXIED = {
    ("POST", b"/v1/completions"),
    ("POST", b"/v1/chat/completions"),
    ("GET", b"/v1/models"),
}
MAX_TIMEOUT_DIGITS = 9  # x-revgate-timeout-ms: up to about 11 days, far past any route's deadline
BAD_TIMEOUT = json.dumps({"error": {
    "message": f"x-revgate-timeout-ms is not a whole number of milliseconds of at most {MAX_TIMEOUT_DIGITS} digits",
    "type": "invalid_request_error", "where": "header x-revgate-timeout-ms",
    "fix": "Send a positive whole number of milliseconds, e.g. 30000, or leave the header out.",
}}).encode()
_declared = declared_labels  # the name the record-sink tests know it by


def _expire(call: Call, task: asyncio.Task[None]) -> None:
    call.expired = True
    task.cancel()


def _send(call: Call, connection: UpstreamConnection, address: Address, relay: Relay) -> None:
    """Send the call's request to ``address`` on ``connection``, its answer into ``relay``.

    The one way a proxied request leaves the router (the first attempt, a retry, a resend on a
    fresh connection, the fallback to stable), so every attempt carries the same bytes and the
    caller's backpressure reaches the connection actually serving it.
    """
    call.caller.attach(connection, relay)
    connection.send(request_bytes(call.request.method, call.path, address, call.body,
                                  b"X-Request-Id: " + call.request_id.encode() + b"\r\n"), relay)


def _upstream_body(target: Target, path: bytes, body: bytes, document: Any, changed: bool) -> tuple[bytes, bool]:
    """The body ``target`` gets (its model name, its output cap; ``changed``: the parsed body was edited
    already), and whether the parsed body now differs from what the caller sent."""
    return upstream_body(body, document, changed, path=path, served_model=target.served_model,
                         max_output_tokens=target.max_output_tokens)


def _retries(call: Call) -> int:
    """Attempts after the first: the serving revision's interface policy, else the route's."""
    retries = call.target.max_retries
    return call.route.max_retries if retries is None else retries


def _release(call: Call, deadlines: Deadlines) -> None:
    """Stop watching the call's deadline and drop the references that would make a cycle of it.

    Per-request objects freed by reference counting never wake the cyclic collector.
    """
    if call.deadline_slot is not None:
        deadlines.leave(call.deadline_slot, call)
        call.deadline_slot = None
    call.connection = None


def _outcome(status: int) -> Outcome:
    """A completed response's outcome: 429 and 503 are the upstream refusing work (rejected)."""
    if status < 400:
        return "ok"
    return "rejected" if status in (429, 503) else "error"


class Router:
    """Serves one route from a route store."""

    def __init__(self, store: RouteStore, config: RouterConfig) -> None:
        self.store, self.config = store, config
        Relay.keep_bytes = config.record_keep_bytes  # one router per process: the relays' class setting
        self.route: PinnedRoute | None = None  # the one reference a swap replaces
        self.regressed: dict[str, Any] | None = None  # set while the store holds an older generation than served
        self.metrics = RouterMetrics()
        self.pool = UpstreamPool()
        self.outlets = RecordOutlets(config)
        self.records, self.paired = self.outlets.requests, self.outlets.paired
        self.shadows = ShadowDispatch(config, records=self.records, paired=self.paired, metrics=self.metrics,
                                      pool=self.pool, current_route=lambda: self.route,
                                      next_endpoint=self._next_endpoint)
        self.mirror = self.shadows.mirror
        self.ids = RequestIds()
        self.ejections = Ejections()
        self._round_robin = 0
        self._refresh_lock: asyncio.Lock | None = None
        self._servers: list[asyncio.Server] = []
        self.watchdogs: list[Watchdog] = []  # the public port's first, then the admin port's
        self._poller: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop  # set by start(), before the first request
        # The parts' entry points, bound once: the request path calls them without a lookup through the part.
        self._record = Recorder(self.records, self.metrics, record_outputs=config.record_outputs).record
        self._offer_shadow = self.shadows.offer
        self.admin_api = AdminApi(self)
        self.admin, self.health = self.admin_api.serve, self.admin_api.health

    # --- snapshots -------------------------------------------------------------------------

    def install(self, snapshot: RouteSnapshot | None) -> str:
        """Swap in ``snapshot`` if it is newer than the one served; says what happened."""
        current = self.route
        if snapshot is None:
            return "missing"
        if snapshot.route != self.config.route:
            self.metrics.count_event("snapshot_rejected", self.config.route)
            return "wrong-route"
        if current is not None and snapshot.generation <= current.snapshot.generation:
            if snapshot.generation < current.snapshot.generation:
                self._regressed(snapshot.generation, current.snapshot.generation)
                return "older"
            self.regressed = None
            return "unchanged"
        self.regressed = None
        self._install(snapshot)
        return "installed"

    def _regressed(self, stored: int, served: int) -> None:
        """The store's generation went backwards (restored from a backup, recreated): a new store epoch.

        The router keeps serving what it serves and says so, loudly, until the store catches up or an
        operator accepts the store's snapshot (``POST /admin/accept-store-epoch``): never silence,
        which let every router keep its newer snapshot for ever while the flow counted it as serving.
        """
        self.metrics.count_event("snapshot_regressed", self.config.route)
        if self.regressed is None or self.regressed["store_generation"] != stored:
            log.error("route %s: the store holds generation %d, older than the %d served: a new store epoch? "
                      "serving generation %d until the store catches up or an operator accepts its snapshot "
                      "(POST /admin/accept-store-epoch)", self.config.route, stored, served, served)
        self.regressed = {"store_generation": stored, "served_generation": served,
                          "message": f"the route store went back from generation {served} to {stored}",
                          "fix": "Check the store; to serve its snapshot, POST /admin/accept-store-epoch."}

    async def accept_store_epoch(self) -> str:
        """An operator's word: serve the store's snapshot even though its generation is older."""
        snapshot = await asyncio.get_running_loop().run_in_executor(None, self.store.read, self.config.route)
        if snapshot is None or snapshot.route != self.config.route:
            return "missing"
        log.warning("route %s: an operator accepted the store's generation %d as a new epoch", snapshot.route,
                    snapshot.generation)
        self.regressed = None
        self._install(snapshot)
        return "installed"

    def _install(self, snapshot: RouteSnapshot) -> None:
        self.route = compile_route(snapshot)
        self.metrics.generation[(("route", snapshot.route),)] = snapshot.generation
        self.metrics.count_event("snapshot_installed", snapshot.route)
        log.info("route %s: serving generation %d", snapshot.route, snapshot.generation)

    async def refresh(self) -> str:
        """Read the store once; a corrupt or unreachable store keeps the last good snapshot."""
        if self._refresh_lock is None:
            self._refresh_lock = asyncio.Lock()
        async with self._refresh_lock:
            loop = asyncio.get_running_loop()
            try:
                snapshot = await loop.run_in_executor(None, self.store.read, self.config.route)
            except ManifestInvalid as error:
                self.metrics.count_event("snapshot_invalid", self.config.route)
                log.warning("ignoring invalid route snapshot, keeping the last good one: %s", error)
                return "invalid"
            except Exception as error:  # the data plane outlives any store failure
                self.metrics.count_event("store_unavailable", self.config.route)
                log.warning("route store unavailable, keeping the last good snapshot: %s", error)
                return "unavailable"
            return self.install(snapshot)

    async def _poll(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.config.poll_interval_s)

    # --- serving ---------------------------------------------------------------------------

    def handle(self, caller: ServerConnection, request: Request) -> Coroutine[Any, Any, None] | None:
        """Serve one public request: from callbacks when a pooled upstream connection is idle, else as a task."""
        path = request.path.split(b"?", 1)[0]
        route = self.route  # read once: this request is pinned to this snapshot
        if route is None or (request.method, path) not in PROXIED:
            return self._unrouted(caller, request, path, route)
        call = self._pin(caller, request, route, path)
        if call is None:
            return None
        first = self._next_endpoint(call.target)
        connection = self.pool.take(call.target.endpoints[first])
        if connection is None:
            return self._serve(call, first)
        self._serve_pooled(call, first, connection)
        return None

    async def _unrouted(self, caller: ServerConnection, request: Request, path: bytes,
                        route: PinnedRoute | None) -> None:
        if (request.method, path) in PROXIED:
            caller.respond(503, NO_ROUTE, keep_alive=request.keep_alive)
        elif path != b"/health":
            body = error_body(f"no such endpoint: {path.decode()}", "not_found")
            caller.respond(404, body, keep_alive=request.keep_alive)
        elif route is None:
            caller.respond(503, NO_ROUTE, keep_alive=request.keep_alive)
        else:
            caller.respond(200, b'{"status":"ok"}', keep_alive=request.keep_alive)

    def _pin(self, caller: ServerConnection, request: Request, route: PinnedRoute, path: bytes) -> Call | None:
        """Everything decided at entry; None (answered 400, connection kept) for an unreadable id header."""
        headers = request.headers
        arrival = time.time()
        caller_id = caller_text(headers.get(b"x-request-id", b""))
        tenant_raw = headers.get(b"x-tenant-id", b"")
        tenant = caller_text(tenant_raw)
        if caller_id is None or tenant is None:
            caller.respond(400, bad_id("x-request-id" if caller_id is None else "x-tenant-id"),
                           keep_alive=request.keep_alive)
            caller.request_done()
            return None
        timeout = headers.get(b"x-revgate-timeout-ms")
        readable = timeout is None or (len(timeout) <= MAX_TIMEOUT_DIGITS and timeout.isdigit() and timeout.strip(b"0"))
        if not readable:
            caller.respond(400, BAD_TIMEOUT, keep_alive=request.keep_alive)
            caller.request_done()
            return None
        request_id = self.ids.next()
        key = headers.get(b"x-session-id") or tenant_raw or request_id
        target = route.stable if path == b"/v1/models" else route.assign(key, arrival)
        fallback_from = ""
        if target is route.candidate and not self.ejections.any_live(target.endpoints, self._loop.time()):
            fallback_from, target = target.fingerprint, self._fallback(route)  # every candidate replica refused
        body = request.body
        document = parse_body(body) if body else None  # once per request: model, labels, the shadow check
        # Evidence about a request (its slice, probe class, task) only from who may give it: otherwise
        # one tenant could fail any canary on a slice of its choosing, or spend its failures on stable.
        trusted = route.trusts(headers.get(b"x-revgate-credential"))
        declared = declared_labels(headers, document) if trusted else {}
        body, stripped = _upstream_body(target, path, body, document, drop_evidence_metadata(document))
        revealed = trusted or route.reveal
        extra = (target.headers if revealed else b"") + b"x-request-id: " + request_id + b"\r\n"
        call = Call(caller, request, route, target, path, body, request_id.decode(), caller_id, tenant,
                    declared, arrival, extra, target.labels, document=document, revealed=revealed,
                    stripped=stripped, fallback_from=fallback_from)
        call.deadline = self._loop.time() + self._timeout_s(call)
        return call

    # The common exchange, without a task: a pooled connection, one request, callbacks to the end.
    # Anything else (no idle connection, a retry, a stale connection) continues in _serve as a task.

    def _serve_pooled(self, call: Call, first: int, connection: UpstreamConnection) -> None:
        self.metrics.in_flight[call.labels] += 1
        caller = call.caller
        call.attempts, call.endpoint, call.connection, call.first = 1, call.target.urls[first], connection, first
        relay = Relay(caller, call.headers, call.request.keep_alive, _retries(call) > 0,
                      on_settled=self._pooled_settled, context=call)
        call.relay = caller.exchange = relay
        call.deadline_slot = self.deadlines.add(call, call.deadline)
        caller.on_lost = lambda: self._pooled_lost(call)
        _send(call, connection, call.target.endpoints[first], relay)

    def _pooled_settled(self, relay: Relay) -> None:
        call: Call = relay.context
        relay.context = None
        _release(call, self.deadlines)
        self.metrics.in_flight[call.labels] -= 1
        if not relay.started:  # a retry or a resend on a fresh connection: as a task from here
            call.caller.continue_in(self._serve(call, call.first, relay))
            return
        self.ejections.answered(call.target.endpoints[call.first])
        self._answered(call, relay)
        call.caller.request_done()

    def _pooled_expired(self, call: Call) -> None:
        call.expired = True
        self._pooled_end(call)
        self._fail(call, "timeout", 504, CALLER_DEADLINE if call.callers_deadline else ROUTE_DEADLINE)
        call.caller.request_done()

    def _pooled_lost(self, call: Call) -> None:
        self._pooled_end(call)
        self._abandoned(call)

    def _pooled_end(self, call: Call) -> None:
        """Cancel the upstream exchange (the caller left or the deadline passed)."""
        if call.relay is not None:
            call.relay.on_settled = call.relay.context = None  # the close below must not report back
        if call.connection is not None:
            call.connection.close()
        _release(call, self.deadlines)
        self.metrics.in_flight[call.labels] -= 1

    async def _serve(self, call: Call, first: int, settled: Relay | None = None) -> None:
        labels = call.labels
        self.metrics.in_flight[labels] += 1
        task = asyncio.current_task()
        assert task is not None
        # One timer handle instead of asyncio.timeout(): the deadline cancels the task, and the
        # handler tells a passed deadline from a departed caller by the call's flag.
        timer = asyncio.get_running_loop().call_at(call.deadline, _expire, call, task)
        try:
            await self._attempts(call, first, settled)
        except asyncio.CancelledError:
            if call.expired:
                task.uncancel()
                self._fail(call, "timeout", 504, CALLER_DEADLINE if call.callers_deadline else ROUTE_DEADLINE)
                return
            self._abandoned(call)
            raise
        finally:
            timer.cancel()
            self.metrics.in_flight[labels] -= 1

    @staticmethod
    def _timeout_s(call: Call) -> float:
        """The route's deadline (or the revision's, when its interface policy says shorter), or the caller's
        shorter one (``x-revgate-timeout-ms``, checked at entry)."""
        limit = call.route.timeout_s
        if call.target.timeout_s is not None and call.target.timeout_s < limit:
            limit = call.target.timeout_s
        header = call.request.headers.get(b"x-revgate-timeout-ms")
        if header and int(header) / 1000 < limit:
            limit, call.callers_deadline = int(header) / 1000, True
        return limit

    async def _attempts(self, call: Call, first: int, settled: Relay | None) -> None:
        """Attempts in retry order; ``settled`` is the first attempt's relay when it already ran."""
        order = self._live_first(call.target, retry_order(call.target, call.route.failure_domains, first))
        plan = [order[step % len(order)] for step in range(_retries(call) + 1)]
        number = unsent = 0
        while number < len(plan):
            index = plan[number]
            number += 1
            call.attempts, call.endpoint = number, call.target.urls[index]
            may_retry = number < len(plan) or self._may_fall_back(call)
            relay = await self._attempt(call, index, may_retry=may_retry, settled=settled)
            settled = None
            call.relay = relay
            if relay.started:
                self._answered(call, relay)
                return
            if relay.error is not None and relay.error.unsent and unsent < len(call.target.endpoints):
                # A refused connection carried nothing: it spends no retry. Another live replica of the same
                # revision takes the request; with none, the fallback below (the candidate) or the failure.
                unsent += 1
                if (spare := self._another_live(call.target, index)) is not None:
                    plan.insert(number, spare)
            if number < len(plan) or self._may_fall_back(call):
                reason = str(relay.error) if relay.error else f"upstream status {relay.status}"
                self._record(call, "error", reason)
            if number == len(plan) and self._may_fall_back(call):
                # Nothing reached the caller and no candidate replica answers: stable serves it.
                call.fallback_from = call.target.fingerprint
                self._retarget(call, self._fallback(call.route))
                stable = call.target
                order = self._live_first(stable, list(range(len(stable.endpoints))))
                plan += [order[step % len(order)] for step in range(_retries(call) + 1)]
        message = str(call.relay.error) if call.relay and call.relay.error else "upstream unavailable"
        self._fail(call, "error", 502, message)

    def _another_live(self, target: Target, tried: int) -> int | None:
        """A live endpoint of ``target`` other than ``tried`` (the freshly ejected one), or None."""
        now = self._loop.time()
        count = len(target.endpoints)
        return next((index for step in range(1, count) if self.ejections.live(
            target.endpoints[index := (tried + step) % count], now)), None)

    def _may_fall_back(self, call: Call) -> bool:
        """Whether a call on the candidate may go to stable: none of the candidate's replicas is live."""
        return call.target is call.route.candidate and not self.ejections.any_live(
            call.target.endpoints, self._loop.time())

    def _live_first(self, target: Target, order: list[int]) -> list[int]:
        """``order`` with ejected endpoints moved to the end (all of them kept: with none live, they are tried)."""
        if not self.ejections.ejected:
            return order
        now = self._loop.time()
        return sorted(order, key=lambda index: not self.ejections.live(target.endpoints[index], now))

    async def _attempt(self, call: Call, index: int, *, may_retry: bool, settled: Relay | None = None) -> Relay:
        address = call.target.endpoints[index]
        fresh = False
        while True:
            if settled is not None:  # ran on a pooled connection already (see _serve_pooled)
                relay, settled = settled, None
                if relay.error is not None and relay.error.stale:
                    fresh = True
                    continue
                return relay
            relay = Relay(call.caller, call.headers, call.request.keep_alive, may_retry)
            call.relay = call.caller.exchange = relay
            try:
                connection = await self.pool.connect(address, fresh=fresh)
            except UpstreamError as error:
                self.ejections.failed(address, self._loop.time())  # refused: no new requests for a while
                relay.on_error(error)
                return relay
            _send(call, connection, address, relay)
            try:
                await relay.wait()
            except asyncio.CancelledError:
                connection.close()  # the caller left or the deadline passed: cancel upstream
                raise
            if relay.error is not None and relay.error.stale and not fresh:
                fresh = True  # an idle keep-alive connection had closed: resend once on a new one
                continue
            if relay.error is not None and relay.status == 0:
                self.ejections.failed(address, self._loop.time())  # reset before answering
            elif relay.started:
                self.ejections.answered(address)
            return relay

    def _next_endpoint(self, target: Target) -> int:
        self._round_robin += 1
        return self.ejections.first_live(target.endpoints, self._round_robin % len(target.endpoints),
                                         self._loop.time())

    def _fallback(self, route: PinnedRoute) -> Target:
        """Stable, for a request the candidate was to serve while none of its replicas answers: counted here,
        and its record names the candidate (``fallback_from``), so the gates count it as the candidate's failure."""
        self.metrics.count_event("fallback_to_stable", route.snapshot.route)
        return route.stable

    def _retarget(self, call: Call, target: Target) -> None:
        """Move a call that nothing has answered yet to ``target`` (its model name, headers and labels)."""
        body, call.stripped = _upstream_body(target, call.path, call.request.body, call.document, call.stripped)
        call.target, call.body, call.labels = target, body, target.labels
        shown = target.headers if call.revealed else b""
        call.headers = shown + b"x-request-id: " + call.request_id.encode() + b"\r\n"

    # --- outcomes --------------------------------------------------------------------------
    # Every request ends in one of three places, whichever path served it (pooled callbacks or the
    # task): _answered (the upstream's answer reached the caller), _abandoned (the caller left) or
    # _fail (the router answers an error). Each ends in _finish: the record, the metrics, the shadow.
    # The response then ends with the connection's request_done (the pooled path calls it; the
    # task's done-callback does for the task).

    def _answered(self, call: Call, relay: Relay) -> None:
        """The upstream's response (complete or cut) went to the caller."""
        self._finish(call, "error" if relay.error else _outcome(relay.status), str(relay.error or ""))
        if relay.error is not None:
            call.caller.abort()  # a truncated stream must not look complete

    def _abandoned(self, call: Call) -> None:
        """The caller went away (after a complete answer, or a stream's [DONE], it still counts as served)."""
        relay = call.relay
        if relay is not None and relay.started and (relay.complete or relay.stream_done):
            self._finish(call, _outcome(relay.status), "")
        else:
            self._finish(call, "cancelled", "the caller disconnected")

    def _fail(self, call: Call, outcome: Outcome, status: int, message: str) -> None:
        relay = call.relay
        if relay is not None and relay.started:
            self._finish(call, outcome, message)
            call.caller.abort()
            return
        kind = "timeout" if outcome == "timeout" else "upstream_error"
        body = error_body(message, kind)
        call.caller.respond(status, body, keep_alive=call.request.keep_alive, headers=call.headers)
        self._finish(call, outcome, message, status=status)

    def _finish(self, call: Call, outcome: Outcome, error: str, status: int | None = None) -> None:
        # Contained: a defect in recording or in the shadow check must never skip the end of the request
        # (its connection would hang, its in-flight count leak); it is logged and counted instead.
        try:
            record = self._record(call, outcome, error, status)
            if outcome == "ok" and call.relay is not None and call.route.shadow is not None:
                self._offer_shadow(call, call.relay, record)
        except Exception:
            log.exception("recording or shadowing request %s failed", call.request_id)
            self.metrics.count_event("record_failed", call.route.snapshot.route)

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self, host: str, port: int, admin_host: str, admin_port: int) -> None:
        """Load the snapshot, then listen on the public and admin ports."""
        self._loop = asyncio.get_running_loop()  # looked up once: each lookup costs a getpid()
        self.deadlines = Deadlines(self._loop, self._pooled_expired)
        await self.refresh()
        # Per-request objects die young and hold no cycles; freezing the startup heap and collecting
        # less often keeps the cyclic collector from rescanning it under load.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        self.outlets.start()
        self.mirror.start()
        self._poller = asyncio.create_task(self._poll())
        limits = self.config.limits
        for handler, where, number in ((self.handle, host, port), (self.admin, admin_host, admin_port)):
            server, watchdog = await serve(handler, where, number, limits)
            self._servers.append(server)
            self.watchdogs.append(watchdog)

    async def close(self) -> None:
        """Stop listening and flush records."""
        for server in self._servers:
            server.close()
        for watchdog in self.watchdogs:
            watchdog.stop()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await self.mirror.stop()
        self.pool.close()
        await self.outlets.close()


async def run_router(store: RouteStore, config: RouterConfig, *, host: str, port: int, admin_host: str,
                     admin_port: int, ready: asyncio.Event | None = None) -> None:
    """Serve until cancelled (SIGINT/SIGTERM in the command)."""
    router = Router(store, config)
    await router.start(host, port, admin_host, admin_port)
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        await router.close()
