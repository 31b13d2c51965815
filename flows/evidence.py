"""Gathering a stage's evidence: replay labelled traffic through the router, split it into arms, grade it.

Plain functions; the flow wraps them in tasks. The comparison arm is always stable traffic from
the same window (a concurrent baseline), never a before/after comparison.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from evaluation.gates import Evidence
from evaluation.graders import exact_match, score_records
from evaluation.records import RequestRecord
from evaluation.replay import replay
from evaluation.traces import TraceEntry
from shadow.records import PairedRecord

OWN_TRAFFIC = re.compile(r"^step\d+-b\d+-")  # request ids of the rollout's replayed evidence (stage_batch)


def stage_batch(trace: Sequence[TraceEntry], stage: str, batch: int, size: int) -> list[TraceEntry]:
    """The ``batch``-th slice of the trace, re-timed to start now and re-identified for this stage.

    Request ids carry the stage so that shadow pairs and records of different stages never mix.
    """
    chosen = [trace[(batch * size + index) % len(trace)] for index in range(size)]
    start = chosen[0].offset_s
    return [
        replace(entry, request_id=f"{stage}-b{batch}-{entry.request_id}", offset_s=max(0.0, entry.offset_s - start))
        for entry in chosen
    ]


def send_batch(router_url: str, entries: Sequence[TraceEntry], model: str = "default") -> list[RequestRecord]:
    """Replay ``entries`` open-loop through the router; one record per request."""
    result = asyncio.run(replay(entries, router_url.rstrip("/") + "/v1", model, timeout_s=120.0))
    return list(result.records)


def canary_arms(
    records: Iterable[RequestRecord], stable: str, candidate: str
) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """Split records by the revision the router says served them (its response header)."""
    stable_arm = [replace(r, arm="stable") for r in records if r.revision == stable]
    candidate_arm = [replace(r, arm="candidate") for r in records if r.revision == candidate]
    return stable_arm, candidate_arm


class PairedRecordsTail:
    """The router's paired-records file, read incrementally: each poll parses only what was appended.

    A stage polls the file after every batch and while the mirror catches up; re-reading the whole
    file each time would grow with every earlier stage's pairs.
    """

    def __init__(self, path: Path, prefix: str) -> None:
        self.path = path
        self.prefix = prefix
        self.offset = 0
        self.pairs: list[PairedRecord] = []

    def poll(self) -> int:
        """Read complete lines appended since the last poll; the number of the stage's pairs so far."""
        if not self.path.exists():
            return len(self.pairs)
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self.offset += len(complete)
        parsed = (PairedRecord.from_json(line) for line in complete.decode("utf-8").splitlines() if line.strip())
        self.pairs += [pair for pair in parsed if pair.caller_request_id.startswith(self.prefix)]
        return len(self.pairs)


def settled_pairs(
    tail: PairedRecordsTail, expected: int, *, quiet_s: float = 1.5, limit_s: float = 30.0
) -> list[PairedRecord]:
    """The stage's pairs once the mirror has caught up: all ``expected`` are in, or none came for ``quiet_s``.

    Mirrored copies are sent after the callers' answers and written in batches, so the newest
    pairs land a little after the replay ends; dropped copies never land (the router counts them).
    """
    deadline = time.monotonic() + limit_s
    count, last_change = tail.poll(), time.monotonic()
    while count < expected and time.monotonic() < deadline and time.monotonic() - last_change < quiet_s:
        time.sleep(0.25)
        if (now := tail.poll()) != count:
            count, last_change = now, time.monotonic()
    return list(tail.pairs)


def _shadow_record(pair: PairedRecord, entry: TraceEntry, arrival: float) -> RequestRecord:
    ok = pair.shadow_status == 200 and not pair.shadow_error
    return RequestRecord(
        request_id=pair.caller_request_id,
        revision=pair.shadow_revision,
        arm="candidate",
        arrival_s=arrival,
        outcome="ok" if ok else "error",
        route=pair.route,
        generation=pair.generation,
        tenant=entry.tenant,
        slices=dict(entry.slices),
        first_token_s=None if pair.shadow_ttft_s is None else arrival + pair.shadow_ttft_s,
        last_token_s=None if pair.shadow_e2e_s is None else arrival + pair.shadow_e2e_s,
        status_code=pair.shadow_status,
        error=pair.shadow_error,
        output_text=pair.shadow_output,
        reference=entry.reference,
        prompt_tokens=pair.shadow_prompt_tokens,
        output_tokens=pair.shadow_output_tokens,
    )


def shadow_arms(
    records: Sequence[RequestRecord], pairs: Sequence[PairedRecord], entries: Sequence[TraceEntry]
) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """Stable arm: the callers' records of mirrored requests; candidate arm: the shadow's answers.

    Only mirrored requests count on both sides, so the arms see the same prompts.
    """
    by_id = {entry.request_id: entry for entry in entries}
    caller = {record.request_id: record for record in records}
    # Joined on the caller's (the replay's) ids: the router names each request with its own id.
    mirrored = [pair for pair in pairs if pair.caller_request_id in caller and pair.caller_request_id in by_id]
    stable_arm = [replace(caller[pair.caller_request_id], arm="stable") for pair in mirrored]
    candidate_arm = [
        _shadow_record(pair, by_id[pair.caller_request_id], caller[pair.caller_request_id].arrival_s)
        for pair in mirrored
    ]
    return stable_arm, candidate_arm


def build_evidence(
    stable: Sequence[RequestRecord],
    candidate: Sequence[RequestRecord],
    *,
    expected_candidate_share: float | None,
    final: bool,
) -> Evidence:
    """Graded evidence (exact match against the reference answer) for the gates."""
    return Evidence(
        stable=tuple(stable),
        candidate=tuple(candidate),
        stable_scores=score_records(stable, exact_match),
        candidate_scores=score_records(candidate, exact_match),
        expected_candidate_share=expected_candidate_share,
        final=final,
    )


class RecordsTail:
    """The router's request-records file, read incrementally (the rollback window looks at it often)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.records: list[RequestRecord] = []

    def poll(self) -> list[RequestRecord]:
        """Every complete record appended so far."""
        if self.path.exists():
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offset += len(complete)
            self.records += [RequestRecord.from_json(line) for line in complete.decode().splitlines() if line.strip()]
        return self.records


def live_arrivals(path: Path, since_s: float, tail_bytes: int = 4 << 20) -> list[float]:
    """Arrival times of live requests in the router's records since ``since_s``.

    The rollout's own replayed evidence traffic (request ids ``stepNN-bN-...``) is not demand the
    revisions must carry: it stops when the rollout does.
    """
    if not path.exists():
        return []
    with path.open("rb") as handle:
        start = max(0, handle.seek(0, 2) - tail_bytes)
        handle.seek(start)
        lines = handle.read().splitlines()
    if start:
        lines = lines[1:]  # the first line read is cut
    arrivals = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line still being written
        if record.get("arrival_s", 0) >= since_s and not OWN_TRAFFIC.match(str(record.get("request_id", ""))):
            arrivals.append(float(record["arrival_s"]))
    return arrivals
