"""Shadow dispatch: a copy of a request stable answered goes to the route's shadow revision.

The copy leaves after the caller has its answer and never touches it: the mirror's queue, bounded
in count and bytes, drops copies rather than slow the request path. The shadow's answer only
ever lands in a paired record (beside stable's) and in a request record of the ``shadow`` arm.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from revgate.evaluation.records import RequestRecord
from revgate.serving.router.call import Call
from revgate.serving.router.config import RouterConfig
from revgate.serving.router.evidence import e2e_s, ttft_s
from revgate.serving.router.metrics import RouterMetrics
from revgate.serving.router.parse import Usage, output_text, upstream_body, usage_of
from revgate.serving.router.relay import Relay
from revgate.serving.router.sink import Sink
from revgate.serving.router.split import PinnedRoute, Target
from revgate.serving.router.upstream import UpstreamPool, request_bytes
from revgate.shadow.mirror import MirrorJob, ShadowAnswer, ShadowMirror
from revgate.shadow.policy import side_effecting_document


class ShadowDispatch:
    """Offers answered calls to the mirror, and sends the copies it takes.

    ``current_route`` reads the snapshot served now (a copy whose shadow left the route is not
    sent); ``next_endpoint`` is the router's own choice of replica, so copies spread like requests.
    """

    def __init__(self, config: RouterConfig, *, records: Sink, paired: Sink, metrics: RouterMetrics,
                 pool: UpstreamPool, current_route: Callable[[], PinnedRoute | None],
                 next_endpoint: Callable[[Target], int]) -> None:
        self.records, self.metrics, self.pool = records, metrics, pool
        self.connect_timeout_s = config.shadow_connect_timeout_s
        self._current_route, self._next_endpoint = current_route, next_endpoint
        self.mirror = ShadowMirror(
            self._send, paired.append, capacity=config.shadow_queue, capacity_bytes=config.shadow_queue_bytes,
            concurrency=config.shadow_concurrency, wanted=self._still_shadowed,
        )

    def offer(self, call: Call, relay: Relay, record: dict[str, Any]) -> None:
        """Queue a copy of ``call`` if its route shadows it; stable's answer travels with it, for the pair."""
        if call.path == b"/v1/models" or relay.status != 200:
            return
        shadow = call.route.shadow_for(call.request_id.encode(), call.arrival_s)
        if shadow is None:
            return
        route = call.route.snapshot.route
        if side_effecting_document(call.document, call.route.side_effecting_tools):
            self.metrics.count_event("shadow_skipped_side_effecting", route)
            return
        # The record already holds the text when outputs are recorded: no second join and parse.
        stable_output = record["output_text"]
        if stable_output is None:
            stable_output = output_text(relay.body(), relay.streamed)
        # The copy's bytes from the request parsed at entry (its evidence metadata already dropped, as stable's
        # was), made here so the queue, bounded by bytes, holds bytes, and the send parses nothing again.
        body, _ = upstream_body(call.request.body, call.document, call.stripped, path=call.path,
                                served_model=shadow.served_model, max_output_tokens=shadow.max_output_tokens)
        job = MirrorJob(
            request_id=call.request_id, route=route, generation=call.route.snapshot.generation,
            path=call.path.decode(), body=body, target=shadow, stable_revision=call.target.fingerprint,
            shadow_revision=shadow.fingerprint, stable_status=relay.status,
            stable_output=stable_output, stable_ttft_s=ttft_s(record),
            stable_e2e_s=e2e_s(record), tenant=call.tenant, caller_request_id=call.caller_request_id,
        )
        accepted = self.mirror.offer(job)
        self.metrics.count_event("shadow_mirrored" if accepted else "shadow_dropped", route)

    def _still_shadowed(self, job: MirrorJob) -> bool:
        """Whether the route served now still mirrors to the copy's shadow revision."""
        route = self._current_route()
        shadow = route.snapshot.shadow if route is not None else None
        return shadow is not None and shadow.fingerprint == job.shadow_revision

    async def _send(self, job: MirrorJob) -> ShadowAnswer:
        """Send one copy to the shadow revision; its answer only ever lands in a paired record."""
        target: Target = job.target
        body = job.body
        address = target.endpoints[self._next_endpoint(target)]
        start = time.time()
        relay = Relay(None, b"", True, False)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                connection = await self.pool.connect(address)
        except TimeoutError:
            return ShadowAnswer(None, None, None, time.time() - start, error="connect timeout")
        mirror_headers = b"X-Request-Id: " + job.request_id.encode() + b"\r\nX-Revgate-Shadow: 1\r\n"
        connection.send(request_bytes("POST", job.path.encode(), address, body, mirror_headers), relay)
        route = self._current_route()
        try:
            async with asyncio.timeout(route.timeout_s if route else 60):
                await relay.wait()
        except TimeoutError:
            connection.close()
            return ShadowAnswer(None, None, None, time.time() - start, error="timeout")
        body = relay.body()  # a stream's parts joined once, for the usage and the text
        usage = usage_of(body, relay.streamed)
        self._record(job, target, relay, start, usage)
        text = output_text(body, relay.streamed)
        ttft = None if relay.first_s is None else relay.first_s - start
        e2e = None if relay.last_s is None else relay.last_s - start
        return ShadowAnswer(relay.status or None, text, ttft, e2e, error=str(relay.error or ""),
                            prompt_tokens=usage.prompt_tokens, output_tokens=usage.output_tokens)

    def _record(self, job: MirrorJob, target: Target, relay: Relay, start: float, usage: Usage) -> None:
        """The shadow's own request record (arm ``shadow``): its latencies and errors, apart from the pair."""
        self.records.append(RequestRecord(
            request_id=job.request_id, revision=target.fingerprint, arm="shadow", arrival_s=start,
            outcome="error" if relay.error or relay.status != 200 else "ok", route=job.route,
            generation=job.generation, tenant=job.tenant, first_token_s=relay.first_s, last_token_s=relay.last_s,
            prompt_tokens=usage.prompt_tokens, output_tokens=usage.output_tokens, finish_reason=usage.finish_reason,
            status_code=relay.status or None, error=str(relay.error or ""), caller_request_id=job.caller_request_id,
        ))
