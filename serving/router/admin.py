"""The admin port: ``/metrics`` (open) and ``/admin/*`` (bearer token), and what they report.

Kept off the request path: the admin port has its own listener, and everything it reports is
read from the router when asked (at scrape time), so serving a request never pays for it.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from revgate.serving.admin_token import authorized
from revgate.serving.router.http import NO_ROUTE, Request, ServerConnection, error_body

if TYPE_CHECKING:
    from revgate.serving.router.service import Router


class AdminApi:
    """Answers the admin port for one router, from its state at the time of each request."""

    def __init__(self, router: Router) -> None:
        self.router = router

    async def serve(self, caller: ServerConnection, request: Request) -> None:
        """The admin port: /metrics (open), /admin/* (bearer token)."""
        router = self.router
        path = request.path.split(b"?", 1)[0]
        if path == b"/metrics":
            self.export_gauges()
            caller.respond(200, router.metrics.render(), content_type=b"text/plain; version=0.0.4")
            return
        if not self._authorised(request):
            caller.respond(401, error_body("admin endpoints need 'Authorization: Bearer <token>'", "unauthorized"))
            return
        if (request.method, path) == ("POST", b"/admin/notify"):
            result = await router.refresh()
            caller.respond(200, json.dumps({"result": result, "generation": self._generation()}).encode())
        elif (request.method, path) == ("POST", b"/admin/accept-store-epoch"):
            result = await router.accept_store_epoch()
            caller.respond(200, json.dumps({"result": result, "generation": self._generation()}).encode())
        elif (request.method, path) == ("GET", b"/admin/health"):
            caller.respond(200, json.dumps(self.health()).encode())
        elif (request.method, path) == ("GET", b"/admin/snapshot"):
            route = router.route
            caller.respond(200 if route else 404, route.snapshot.canonical() if route else NO_ROUTE)
        else:
            caller.respond(404, error_body(f"no such admin endpoint: {path.decode()}", "not_found"))

    def health(self) -> dict[str, Any]:
        """What ``/admin/health`` says: the generation served and each record sink's state."""
        router = self.router
        sinks = {kind: sink.health() for kind, sink in router.outlets.sinks.items()}
        files = {kind: file.health() for kind, file in router.outlets.files.items()}
        ok = router.route is not None and router.regressed is None and all(
            item["ok"] for item in (*sinks.values(), *files.values()))
        return {"status": "ok" if ok else "degraded", "route": router.config.route,
                "router_id": router.config.router_id, "generation": self._generation(), "sinks": sinks,
                "files": files, "store_regressed": router.regressed}

    def _authorised(self, request: Request) -> bool:
        token = self.router.config.admin_token
        if not token:
            return False  # no token configured: admin actions are off, never open
        return authorized(request.headers.get(b"authorization"), token)

    def _generation(self) -> int:
        route = self.router.route
        return 0 if route is None else route.snapshot.generation

    def export_gauges(self) -> None:
        """Values read at scrape time: the mirror's counters, and what a leak would grow (for the soak)."""
        router = self.router
        events, counters, route = router.metrics.events, router.mirror.counters, router.config.route
        public = router.watchdogs[0] if router.watchdogs else None
        for name, value in (("shadow_sent", counters.sent), ("shadow_failed", counters.failed),
                            ("shadow_stale", counters.stale),
                            ("caller_write_paused", public.write_pauses if public else 0),
                            ("caller_write_stalled", public.write_stalls if public else 0),
                            ("caller_buffer_overflowed", public.buffer_overflows if public else 0),
                            ("connections_refused", public.connections_refused if public else 0),
                            ("requests_shed", public.requests_shed if public else 0),
                            ("requests_shed_records", public.requests_shed_records if public else 0),
                            ("endpoint_ejected", router.ejections.count)):
            events[(("event", name), ("route", route))] = value
        held: dict[str, int] = {}
        for kind, sink in router.outlets.sinks.items():
            for name, value in ((f"{kind}_sink_failures", sink.failures), (f"{kind}_sink_dropped", sink.dropped),
                                (f"{kind}_sink_written", sink.written_records)):
                events[(("event", name), ("route", route))] = value
            held[f"{kind}_sink_held"] = sink.held
            held[f"{kind}_sink_ok"] = int(sink.ok)
        for kind, file in router.outlets.files.items():
            for name, value in ((f"{kind}_file_failures", file.failures), (f"{kind}_file_dropped", file.dropped),
                                (f"{kind}_file_written", file.written)):
                events[(("event", name), ("route", route))] = value
            held[f"{kind}_file_held"] = len(file.buffer)
            held[f"{kind}_file_ok"] = int(file.ok)
        router.metrics.process.update(
            tasks=len(asyncio.all_tasks()),
            open_connections=sum(len(watchdog.connections) for watchdog in router.watchdogs),
            shadow_held_bytes=router.mirror.held_bytes, unsent_bytes=public.buffered if public else 0,
            record_held_bytes=public.kept if public else 0,
            caller_connections=len(public.connections) if public else 0, **held,
        )
