"""Open-loop replay of a trace against an OpenAI-compatible endpoint, streaming, one record per request.

Open loop: each request leaves at its scheduled offset whether or not earlier ones have finished,
and its latency is measured from the scheduled time, so a slow server cannot slow the offered load
down (no coordinated omission). How late the generator itself sent each request is measured and
reported; if it is large, the numbers describe the replay machine, not the server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from revgate.evaluation.records import Outcome, RequestRecord
from revgate.evaluation.traces import TraceEntry

REJECT_STATUS = (429, 503)


@dataclass(slots=True)
class _Stream:
    """What one streamed response delivered so far."""

    text: list[str] = field(default_factory=list)
    first_token_s: float | None = None
    last_token_s: float | None = None
    chunks: int = 0
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def take(self, event: dict[str, Any], now: float) -> None:
        """Fold one SSE event (a completion or chat chunk) in."""
        usage = event.get("usage") or {}
        self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
        self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
        for choice in event.get("choices") or []:
            piece = choice.get("text")
            if piece is None:
                piece = (choice.get("delta") or {}).get("content")
            if piece:
                self.text.append(piece)
                self.chunks += 1
                self.first_token_s = self.first_token_s if self.first_token_s is not None else now
                self.last_token_s = now
            self.finish_reason = choice.get("finish_reason") or self.finish_reason


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Records in completion order, and how late the generator sent each request (seconds)."""

    records: tuple[RequestRecord, ...]
    lateness_s: tuple[float, ...]
    wall_s: float


def request_body(entry: TraceEntry, model: str) -> dict[str, Any]:
    """The body as sent: the trace's body with model, streaming and usage reporting filled in."""
    body = dict(entry.body)
    body.setdefault("model", model)
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return body


CREDENTIAL_HEADER = "x-revgate-credential"  # lets a router take a request's declared labels as evidence


def request_headers(entry: TraceEntry, credential: str = "") -> dict[str, str]:
    """Identity and labels a router records and keys on: request id, tenant, slices.

    A router takes the slices as evidence only with a ``credential`` the route trusts (the rollout's
    probe credential); without one they are the caller's claim, and ignored.
    """
    # Each trace request is its own conversation: keyed by request, the canary split is per request
    # (keyed by tenant, a handful of tenants would land all-or-nothing on the candidate).
    headers = {"x-request-id": entry.request_id, "x-session-id": entry.request_id}
    if entry.tenant:
        headers["x-tenant-id"] = entry.tenant
    if entry.slices:
        headers["x-revgate-slices"] = ";".join(f"{key}={value}" for key, value in sorted(entry.slices.items()))
    if credential:
        headers[CREDENTIAL_HEADER] = credential
    return headers


def _record(
    entry: TraceEntry,
    arrival: float,
    outcome: Outcome,
    stream: _Stream,
    *,
    revision: str,
    endpoint: str,
    status: int | None = None,
    error: str = "",
    router_id: str = "",
) -> RequestRecord:
    return RequestRecord(
        request_id=entry.request_id,
        revision=revision,
        arm="direct",
        arrival_s=arrival,
        outcome=outcome,
        tenant=entry.tenant,
        slices=dict(entry.slices),
        endpoint=endpoint,
        first_token_s=stream.first_token_s,
        last_token_s=stream.last_token_s,
        prompt_tokens=stream.prompt_tokens,
        output_tokens=stream.completion_tokens or stream.chunks or None,
        finish_reason=stream.finish_reason,
        status_code=status,
        error=error,
        output_text="".join(stream.text) if outcome == "ok" else None,
        reference=entry.reference,
        router_request_id=router_id,
    )


async def send_one(
    session: aiohttp.ClientSession,
    target: str,
    entry: TraceEntry,
    *,
    model: str,
    arrival: float,
    timeout_s: float,
    clock: Callable[[], float] = time.time,
    credential: str = "",
) -> RequestRecord:
    """Send one request, stream the answer, and describe what happened (never raises for server faults)."""
    url = target.rstrip("/") + entry.endpoint.removeprefix("/v1")
    stream = _Stream()
    revision, router_id = model, ""
    headers = request_headers(entry, credential)
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=request_body(entry, model), headers=headers) as response:
                revision = response.headers.get("x-revgate-revision", model)
                answered_id = response.headers.get("x-request-id", "")
                router_id = answered_id if answered_id != entry.request_id else ""
                if response.status != 200:
                    detail = (await response.text())[:200]
                    outcome: Outcome = "rejected" if response.status in REJECT_STATUS else "error"
                    return _record(
                        entry,
                        arrival,
                        outcome,
                        stream,
                        revision=revision,
                        endpoint=url,
                        status=response.status,
                        error=detail,
                        router_id=router_id,
                    )
                async for raw in response.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        stream.take(json.loads(line[5:]), clock())
                return _record(entry, arrival, "ok", stream, revision=revision, endpoint=url, status=200,
                               router_id=router_id)
    except TimeoutError:
        return _record(
            entry, arrival, "timeout", stream, revision=revision, endpoint=url, error=f"no answer within {timeout_s} s",
            router_id=router_id,
        )
    except asyncio.CancelledError:
        return _record(entry, arrival, "cancelled", stream, revision=revision, endpoint=url, error="replay cancelled",
                       router_id=router_id)
    except (aiohttp.ClientError, json.JSONDecodeError) as error:
        return _record(
            entry, arrival, "error", stream, revision=revision, endpoint=url, error=f"{type(error).__name__}: {error}",
            router_id=router_id,
        )


async def replay(
    entries: Sequence[TraceEntry],
    target: str,
    model: str,
    *,
    timeout_s: float = 60.0,
    on_record: Callable[[RequestRecord], None] | None = None,
    max_connections: int = 1024,
    max_in_flight: int | None = None,
    credential: str = "",
) -> ReplayResult:
    """Send every entry at its offset (open loop) and gather one record per request.

    With ``max_in_flight`` the replay is paced instead: an entry waits for its offset and for one of
    that many slots, and is timed from when it left. Probes use it so that the load they add stays
    what the revisions are measured under, rather than a flood that decides the latency gates.
    """
    connector = aiohttp.TCPConnector(limit=max_connections)
    lateness: list[float] = []
    records: list[RequestRecord] = []
    slots = asyncio.Semaphore(max_in_flight) if max_in_flight is not None else None

    async def run(entry: TraceEntry, arrival: float) -> None:
        try:
            record = await send_one(session, target, entry, model=model, arrival=arrival, timeout_s=timeout_s,
                                    clock=clock, credential=credential)
        finally:
            if slots is not None:
                slots.release()
        records.append(record)
        if on_record is not None:
            on_record(record)

    async with aiohttp.ClientSession(connector=connector) as session:
        loop = asyncio.get_running_loop()
        start_mono, start_wall = loop.time(), time.time()

        def clock() -> float:
            # Wall-clock seconds read from the monotonic clock, so a clock step cannot bend latencies.
            return start_wall + (loop.time() - start_mono)

        tasks = []
        for entry in entries:
            delay = start_mono + entry.offset_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            lateness.append(max(0.0, loop.time() - (start_mono + entry.offset_s)))
            if slots is not None:
                await slots.acquire()
                tasks.append(asyncio.create_task(run(entry, clock())))  # paced: timed from when it left
                continue
            # Latency counts from the scheduled time, so the generator's own lateness is charged to it.
            tasks.append(asyncio.create_task(run(entry, start_wall + entry.offset_s)))
        await asyncio.gather(*tasks)
        wall = loop.time() - start_mono
    return ReplayResult(tuple(records), tuple(lateness), wall)
