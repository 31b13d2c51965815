"""The evidence a request leaves: the labels it declares, its record, and the metrics that count it.

Gates decide promotions from these records alone, so what a record says, and which labels a caller
may attach to it, is kept apart from how the request was proxied. The request path hands a
finished ``Call`` to ``Recorder.record``; where the records then go is ``RecordOutlets``.
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any

from revgate.evaluation.records import Outcome, RequestRecord
from revgate.registry.record_store import open_record_store
from revgate.serving.router.call import Call
from revgate.serving.router.config import RouterConfig
from revgate.serving.router.metrics import RouterMetrics
from revgate.serving.router.parse import output_text, usage_of
from revgate.serving.router.records import JsonLinesWriter
from revgate.serving.router.sink import ObjectSink, Sink, Tee

# A record as its JSON object (see Recorder.record): RequestRecord's fields, in order. Checked at
# import, so a change to RequestRecord cannot silently drift from the lines the router writes.
RECORD_KEYS = (
    "request_id", "revision", "arm", "arrival_s", "outcome", "attempt", "route", "generation", "tenant", "slices",
    "endpoint", "first_token_s", "last_token_s", "prompt_tokens", "output_tokens", "finish_reason", "status_code",
    "error", "output_text", "reference", "caller_request_id", "fallback_from",
)
REPLAY_ONLY_KEYS = ("router_request_id",)  # what only a replay knows (the router's id is its request_id)
if tuple(item.name for item in fields(RequestRecord)) != (*RECORD_KEYS, *REPLAY_ONLY_KEYS):  # pragma: no cover
    raise ImportError("serving.router.evidence: RequestRecord's fields changed; update Recorder.record and RECORD_KEYS")


def ttft_s(record: dict[str, Any]) -> float | None:
    """``RequestRecord.ttft_s`` of a record object."""
    first = record["first_token_s"]
    return None if first is None else float(first - record["arrival_s"])


def e2e_s(record: dict[str, Any]) -> float | None:
    """``RequestRecord.e2e_s`` of a record object."""
    last = record["last_token_s"]
    return None if last is None else float(last - record["arrival_s"])


def tpot_s(record: dict[str, Any]) -> float | None:
    """``RequestRecord.tpot_s`` of a record object."""
    first, last, tokens = record["first_token_s"], record["last_token_s"], record["output_tokens"]
    if first is None or last is None or not tokens or tokens < 2:
        return None
    return float((last - first) / (tokens - 1))


# --- declared labels -------------------------------------------------------------------------

MAX_LABELS = 16  # declared labels kept per request, each at most MAX_LABEL_CHARS
MAX_LABEL_CHARS = 128
_LABEL_HEADERS = ((b"x-revgate-class", "class"), (b"x-revgate-task", "task"))


def slices_of(header: bytes | None) -> dict[str, str]:
    """``x-revgate-slices: lang=en;bucket=short`` into a dict."""
    if not header:
        return {}
    pairs = (item.split("=", 1) for item in header.decode(errors="replace").split(";") if "=" in item)
    return {key.strip(): value.strip() for key, value in pairs}


def declared_labels(headers: dict[bytes, bytes], document: Any) -> dict[str, str]:
    """The labels a request declares about itself, for slicing: ``x-revgate-slices``, ``x-revgate-class``,
    ``x-revgate-task``, and the body's ``metadata`` entries named ``revgate_<label>`` (headers win).

    ``document`` is the body as parsed once at entry. Bounded in number and length: a caller's
    labels end up in every record and every slice of the gates.
    """
    labels = slices_of(headers.get(b"x-revgate-slices"))
    if isinstance(document, dict) and "metadata" in document:
        labels = {**_metadata_labels(document), **labels}
    for header, key in _LABEL_HEADERS:
        value = headers.get(header)
        if value:
            labels[key] = value.decode(errors="replace").strip()
    if len(labels) > MAX_LABELS or any(len(key) + len(value) > MAX_LABEL_CHARS for key, value in labels.items()):
        labels = {key[:MAX_LABEL_CHARS]: value[:MAX_LABEL_CHARS] for key, value in list(labels.items())[:MAX_LABELS]}
    return labels


def _metadata_labels(document: dict[str, Any]) -> dict[str, str]:
    metadata = document.get("metadata")
    if not isinstance(metadata, dict):
        return {}
    return {key.removeprefix("revgate_"): value for key, value in metadata.items()
            if isinstance(key, str) and key.startswith("revgate_") and isinstance(value, str)}


# --- records ---------------------------------------------------------------------------------

class RecordOutlets:
    """Where records go: the JSON-lines files, the record store's sink, or both, per kind of record.

    Either way each record is one append, so the request path never knows which are configured.
    """

    def __init__(self, config: RouterConfig) -> None:
        self.sinks: dict[str, ObjectSink] = {}
        self.files = {kind: JsonLinesWriter(path, capacity=config.sink_capacity, kind=kind)
                      for kind, path in (("requests", config.records), ("paired", config.paired_records))
                      if path is not None}
        self.requests = self._outlet(config, "requests")
        self.paired = self._outlet(config, "paired")

    def _outlet(self, config: RouterConfig, kind: str) -> Sink:
        file = self.files.get(kind) or JsonLinesWriter(None)
        if config.records_sink is None:
            return file
        sink = self.sinks[kind] = ObjectSink(open_record_store(config.records_sink), config.route, kind,
                                             config.router_id, interval_s=config.sink_interval_s,
                                             capacity=config.sink_capacity, signer=config.records_signer)
        return sink if file.path is None else Tee(file, sink)

    def start(self) -> None:
        self.requests.start()
        self.paired.start()

    async def close(self) -> None:
        """Flush what is held: records are the evidence, a clean stop loses none."""
        await self.requests.close()
        await self.paired.close()


class Recorder:
    """Turns a finished attempt into its record and counts it in the metrics."""

    __slots__ = ("metrics", "record_outputs", "records")

    def __init__(self, records: Sink, metrics: RouterMetrics, *, record_outputs: bool) -> None:
        self.records, self.metrics, self.record_outputs = records, metrics, record_outputs

    def record(self, call: Call, outcome: Outcome, error: str, status: int | None = None) -> dict[str, Any]:
        """Queue the attempt's record and count it; the record is a ``RequestRecord``'s JSON object.

        Built as that object directly (same keys, same order, so the same line): constructing the
        frozen dataclass and serialising it cost more than the rest of the record's bookkeeping.
        """
        relay = call.relay
        body = relay.body() if relay is not None else b""
        streamed = relay is not None and relay.streamed
        usage = usage_of(body, streamed)
        record = {
            "request_id": call.request_id,
            "revision": call.target.fingerprint,
            "arm": "candidate" if call.target.arm == "candidate" else "stable",
            "arrival_s": call.arrival_s,
            "outcome": outcome,
            "attempt": call.attempts,
            "route": call.route.snapshot.route,
            "generation": call.route.snapshot.generation,
            "tenant": call.tenant,
            "slices": call.slices,
            "endpoint": call.endpoint,
            "first_token_s": relay.first_s if relay else None,
            "last_token_s": (relay.last_s or time.time()) if relay else time.time(),
            "prompt_tokens": usage.prompt_tokens,
            "output_tokens": usage.output_tokens,
            "finish_reason": usage.finish_reason,
            "status_code": status or (relay.status if relay and relay.status else None),
            "error": error,
            "output_text": output_text(body, streamed) if self.record_outputs and body else None,
            "reference": None,
            "caller_request_id": call.caller_request_id,
            "fallback_from": call.fallback_from,
        }
        self.records.append(record)
        self.observe(call, record)
        return record

    def observe(self, call: Call, record: dict[str, Any]) -> None:
        """The record's counts and latencies, under the labels compiled with its target."""
        target, outcome = call.target, record["outcome"]
        labels = target.outcome_labels.get(outcome)
        if labels is None:
            labels = (*target.labels, ("arm", target.arm), ("outcome", outcome))
        metrics = self.metrics
        metrics.requests[labels] += 1
        if outcome != "ok":
            return
        short = target.labels
        ttft, tpot, e2e = ttft_s(record), tpot_s(record), e2e_s(record)
        if ttft is not None:
            metrics.ttft.observe(short, ttft)
        if tpot is not None:
            metrics.tpot.observe(short, tpot)
        if e2e is not None:
            metrics.e2e.observe(short, e2e)
