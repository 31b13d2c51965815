"""Gathering a stage's evidence: replay labelled traffic through the router, split it into arms, grade it.

Plain functions; the flow wraps them in tasks. The comparison arm is always stable traffic from
the same window (a concurrent baseline), never a before/after comparison.

Everything the flow knows of the traffic comes from one place, the routers' record sink
(:class:`RecordSource`: a folder in the embedded default, S3 beyond): the stages' arms, the capacity
rule's demand and the rollback window's records, each from every router the route names. No
router's local file is read: with R routers it holds 1/R of the traffic, and with records on S3
nothing at all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from revgate.evaluation.records import RequestRecord, fallback_failure
from revgate.evaluation.replay import replay
from revgate.evaluation.traces import TraceEntry
from revgate.registry.record_signing import signer_keys
from revgate.registry.record_store import REFUSED, RecordReader, RecordStoreUnavailable, StageWindow, open_record_store
from revgate.shadow.records import PairedRecord

PROBE_LABEL, PROBE = "class", "probe"  # the declared request class of the flow's probe traffic


def is_probe(record: RequestRecord) -> bool:
    """Whether the flow's probe traffic sent this request (it declares ``class=probe``)."""
    return record.slices.get(PROBE_LABEL) == PROBE


def stage_batch(trace: Sequence[TraceEntry], stage: str, batch: int, size: int) -> list[TraceEntry]:
    """The ``batch``-th slice of the trace, re-timed to start now and re-identified for this stage.

    Request ids carry the stage so that shadow pairs and records of different stages never mix, and
    every request declares itself a probe (``class=probe`` among its slice labels, which the router
    records) so that the gates tell the flow's own traffic from the users'.
    """
    chosen = [trace[(batch * size + index) % len(trace)] for index in range(size)]
    start = chosen[0].offset_s
    return [
        replace(entry, request_id=f"{stage}-b{batch}-{entry.request_id}", offset_s=max(0.0, entry.offset_s - start),
                slices={**entry.slices, PROBE_LABEL: PROBE})
        for entry in chosen
    ]


def send_batch(router_url: str, entries: Sequence[TraceEntry], model: str = "default", *,
               max_in_flight: int | None = None, credential: str = "") -> list[RequestRecord]:
    """Replay ``entries`` through the router (open loop, or paced to ``max_in_flight``); one record per request.

    With the rollout's probe ``credential`` the router takes the entries' labels (slices, ``class=probe``)
    as evidence; each record names the router's id for its request (``router_request_id``).
    """
    result = asyncio.run(replay(entries, router_url.rstrip("/") + "/v1", model, timeout_s=120.0,
                                max_in_flight=max_in_flight, credential=credential))
    return list(result.records)


def probe_labels(sent: Iterable[RequestRecord], entries: Sequence[TraceEntry]) -> dict[str, TraceEntry]:
    """Each probe's trace entry (its reference answer) by the id the router gave it, as its answer said.

    Never by the probe's own x-request-id: any caller can send that id (and the flow's are predictable),
    while the router's id is the router's alone.
    """
    by_trace = {entry.request_id: entry for entry in entries}
    return {record.router_request_id: by_trace[record.request_id] for record in sent
            if record.router_request_id and record.request_id in by_trace}


DEMAND_WINDOW_S = 30.0
# Routers write one object per interval (1 s by default), after the request ended: the newest second
# or two of traffic is not in the sink yet. Demand is counted over a window that ends this far back.
DEMAND_LAG_S = 3.0


@dataclass(frozen=True, slots=True)
class Demand:
    """Live requests per second over a past window, every router's, and whether the sink could be read."""

    rps: float
    per_router: dict[str, int]
    unavailable: str = ""  # why the sink could not be read ("" when it could): then the demand is unknown


@dataclass(frozen=True, slots=True)
class RecordSource:
    """The routers' record sink as the flow reads it: its one evidence source.

    ``signers`` (router id: public key) names the routers whose signed records count; empty, every
    object in the sink is believed (one machine).
    """

    sink: str
    route: str
    signers: Mapping[str, str] = field(default_factory=dict)

    def stage(self, window: StageWindow, *, paired: bool) -> StageRecords:
        """One stage's records (and pairs, in shadow), read incrementally."""
        return StageRecords(self.sink, self.route, window, paired=paired, signers=self.signers)

    def tail(self, since_s: float) -> SinkTail:
        """Every router's request records from ``since_s`` on, each poll giving the new ones (the window)."""
        return SinkTail(self.sink, self.route, since_s, self.signers)

    def demand(self, now: float, window_s: float = DEMAND_WINDOW_S, lag_s: float = DEMAND_LAG_S) -> Demand:
        """Users' requests per second over ``[now - lag_s - window_s, now - lag_s)``, from every router.

        Each request counts once (its retries and a second router's record of it do not add), the
        shadow's copies and the rollout's own probes not at all: neither is demand the revisions carry
        once the rollout ends.
        """
        until = now - lag_s
        tail = SinkTail(self.sink, self.route, until - window_s, self.signers)
        records = tail.poll()
        if tail.unavailable:
            return Demand(0.0, {}, tail.unavailable)
        users = {r.request_id: r for r in records
                 if r.arm != "shadow" and not is_probe(r) and r.arrival_s < until}
        per_router = dict(tail.reader.totals)
        return Demand(len(users) / window_s, per_router)


class SinkTail:
    """Every router's request records in the record sink, read incrementally from ``since_s`` (the rollback
    window's source where the routers write to a sink: the site configuration documented for production).

    A sink that cannot be read now gives nothing this time (said in ``unavailable``); the next poll
    goes on from where the last whole read stopped.
    """

    def __init__(self, sink: str, route: str, since_s: float, signers: Mapping[str, str] | None = None) -> None:
        # With signers, only the named routers' signed objects are read (registry/record_store.py).
        keys = signer_keys(signers) if signers else None
        self.reader = RecordReader(open_record_store(sink), route, "requests", lambda data: RequestRecord(**data),
                                   keys=keys)
        self.window = StageWindow(since_s=since_s)
        self.unavailable = ""

    def poll(self) -> list[RequestRecord]:
        """The records the routers wrote since the last poll."""
        try:
            read = self.reader.read(self.window)
        except RecordStoreUnavailable as error:
            self.unavailable = error.what
            return []
        self.unavailable = ""
        return read.records


def own_traffic(record: dict[str, object]) -> bool:
    """Whether a router record is the rollout's own replayed probe: its ``class=probe`` label, which a router
    takes only from a request carrying the rollout's probe credential (never by id: callers choose theirs)."""
    slices = record.get("slices")
    return isinstance(slices, dict) and slices.get(PROBE_LABEL) == PROBE


# --- the record sink: every router's records of one stage ----------------------------------------


@dataclass(frozen=True, slots=True)
class StageArms:
    """A stage's two arms as read from the sink, and where they came from."""

    stable: list[RequestRecord]
    candidate: list[RequestRecord]
    per_router: dict[str, int]
    lost: tuple[str, ...]  # evidence the sink could not give: missing objects, drops, an unreachable store
    prompts: dict[str, str] = field(default_factory=dict)  # shadow: what each paired request asked, by id
    fallbacks: int = 0  # canary requests the candidate was assigned and stable served: in its arm as failures

    def counts(self) -> dict[str, int]:
        """Requests per arm from users and from the flow's probes."""
        return {f"{arm}_{origin}": sum(is_probe(r) == (origin == "probes") for r in records)
                for arm, records in (("stable", self.stable), ("candidate", self.candidate))
                for origin in ("users", "probes")}

    def note(self) -> str:
        """One line for the gate report: how much evidence came from users and how much from probes."""
        c = self.counts()
        routers = ", ".join(f"{name} {count}" for name, count in sorted(self.per_router.items())) or "none"
        fallbacks = (f"; {self.fallbacks} of the candidate's went to stable, no replica of it taking them, and "
                     "count as its failures" if self.fallbacks else "")
        return (f"evidence from the record sink: stable {c['stable_users']} user + {c['stable_probes']} probe"
                f" requests, candidate {c['candidate_users']} user + {c['candidate_probes']} probe requests"
                f" (records per router: {routers}){fallbacks}")


class StageRecords:
    """One stage's records from the record sink, every router's, read incrementally by stage window.

    Each request counts once: the router's record of its last attempt (a probe is never also counted
    from the flow's own replay). Objects the reader reports missing, corrupt or dropped, and a store
    that cannot be read, are lost evidence: the stage cannot pass on them.
    """

    def __init__(self, sink: str, route: str, window: StageWindow, *, paired: bool,
                 signers: Mapping[str, str] | None = None) -> None:
        store = open_record_store(sink)
        keys = signer_keys(signers) if signers else None  # the route's routers: only their signed objects count
        self.window = window
        self.requests = RecordReader(store, route, "requests", lambda data: RequestRecord(**data), keys=keys)
        self.pair_reader = (RecordReader(store, route, "paired", lambda data: PairedRecord(**data), keys=keys)
                            if paired else None)
        self.by_id: dict[str, RequestRecord] = {}
        self.pairs: dict[str, PairedRecord] = {}
        self.origin: dict[tuple[str, str], tuple[str, str]] = {}  # (kind, request id): the router and object kept
        self.per_router: dict[str, int] = {}
        self.lost: list[str] = []
        self.refused: list[str] = []  # objects and records not taken as evidence: reported, not lost
        self.unavailable = ""

    def poll(self) -> int:
        """Read what the routers wrote since the last poll; the number of records and pairs so far."""
        try:
            read = self.requests.read(self.window)
            paired = self.pair_reader.read(self.window) if self.pair_reader is not None else None
        except RecordStoreUnavailable as error:
            self.unavailable = error.what
            return len(self.by_id) + len(self.pairs)
        self.unavailable = ""
        for record, (router, where) in zip(read.records, read.origins, strict=True):
            if record.arm == "shadow":
                continue  # the shadow's answers come as pairs, joined to the caller's request
            known = self.by_id.get(record.request_id)
            kept = self.origin.get(("requests", record.request_id))
            if known is None or (kept is not None and kept[0] == router and record.attempt > known.attempt):
                # New, or the same router's later attempt at it (its own retry) superseding the earlier one.
                self.by_id[record.request_id] = record
                self.origin["requests", record.request_id] = (router, where)
            elif kept is not None and (kept[0] != router or record.attempt == known.attempt):
                self.refused.append(f"duplicate record {record.request_id} attempt {record.attempt} in {where} "
                                    f"(router {router}); the first, attempt {known.attempt} in {kept[1]}, is kept")
        for router, count in read.per_router.items():
            self.per_router[router] = self.per_router.get(router, 0) + count
        problems = [*read.problems, *(paired.problems if paired is not None else [])]
        self.refused += [f"{p.kind} {p.where} (router {p.router}): {p.detail}" for p in problems if p.kind in REFUSED]
        self.lost += [f"{p.router}: {p.kind} {p.detail}" for p in problems if p.kind not in ("unreadable", *REFUSED)]
        for pair, (router, where) in zip(paired.records, paired.origins, strict=True) if paired is not None else ():
            first = self.origin.setdefault(("paired", pair.request_id), (router, where))
            if first == (router, where) and pair.request_id not in self.pairs:
                self.pairs[pair.request_id] = pair
            else:
                self.refused.append(f"duplicate pair {pair.request_id} in {where} (router {router}); the first, "
                                    f"in {first[1]}, is kept")
        return len(self.by_id) + len(self.pairs)

    def settle(self, probes: Iterable[str], *, quiet_s: float = 2.5, limit_s: float = 30.0) -> None:
        """Poll until every probe sent (the router's ids) is in, with its pair in shadow, or none came for ``quiet_s``.

        Routers write their records in batches (one object per interval), and mirrored copies are
        answered after the callers, so the newest evidence lands a little after the traffic ends.
        Progress is counted on the probes alone: users' traffic keeps arriving all the time.
        """
        wanted = set(probes)
        deadline = time.monotonic() + limit_s
        self.poll()
        done, last_change = self._landed(wanted), time.monotonic()
        while done < 2 * len(wanted) and time.monotonic() < deadline and time.monotonic() - last_change < quiet_s:
            time.sleep(0.25)
            self.poll()
            if (now := self._landed(wanted)) != done:
                done, last_change = now, time.monotonic()

    def _landed(self, wanted: set[str]) -> int:
        """Probes whose record is in, plus those whose pair is in (or need none: canary, or a failed request)."""
        callers = [self.by_id[id_] for id_ in wanted if id_ in self.by_id]
        paired = sum(self.pair_reader is None or r.outcome != "ok" or r.request_id in self.pairs for r in callers)
        return len(callers) + paired

    def wait_for(self, more: int, limit_s: float) -> None:
        """Without probes: poll until ``more`` new records arrived from users, or ``limit_s`` passed."""
        goal = self.poll() + more
        deadline = time.monotonic() + limit_s
        while self.poll() < goal and time.monotonic() < deadline:
            time.sleep(0.5)

    def problems(self) -> tuple[str, ...]:
        """Lost evidence so far, and the store's state at the last poll."""
        return (*self.lost, *((f"record store unavailable: {self.unavailable}",) if self.unavailable else ()))

    def canary(self, stable: str, candidate: str, labels: Mapping[str, TraceEntry]) -> StageArms:
        """Arms by the revision that served each request, with the probes' reference answers. A request the
        candidate was assigned and stable served (no candidate replica took it) is the candidate's failure."""
        records = [with_labels(r, labels) for r in self.by_id.values()]
        fallbacks = [fallback_failure(r) for r in records if r.fallback_from == candidate and r.revision == stable]
        return StageArms([replace(r, arm="stable") for r in records if r.revision == stable and not r.fallback_from],
                         [*(replace(r, arm="candidate") for r in records if r.revision == candidate), *fallbacks],
                         dict(self.per_router), self.problems(), fallbacks=len(fallbacks))

    def shadow(self, labels: Mapping[str, TraceEntry]) -> StageArms:
        """Mirrored requests only: the caller's record (stable) and the shadow's answer (candidate) per pair."""
        stable_arm: list[RequestRecord] = []
        candidate_arm: list[RequestRecord] = []
        for pair in self.pairs.values():
            caller = self.by_id.get(pair.request_id)
            if caller is None:
                continue  # its request record is not in yet: no slices, no arrival, so no pair
            caller = with_labels(caller, labels)
            if caller.output_text is None:
                caller = replace(caller, output_text=pair.stable_output)
            stable_arm.append(replace(caller, arm="stable"))
            candidate_arm.append(paired_candidate(pair, caller))
        prompts = {pair.request_id: pair.prompt for pair in self.pairs.values() if pair.prompt is not None}
        return StageArms(stable_arm, candidate_arm, dict(self.per_router), self.problems(), prompts)


def with_labels(record: RequestRecord, labels: Mapping[str, TraceEntry]) -> RequestRecord:
    """The record with its reference answer, where the flow sent it from a labelled trace (``labels`` is keyed
    by the router's id, :func:`probe_labels`)."""
    entry = labels.get(record.request_id)
    return record if entry is None or entry.reference is None else replace(record, reference=entry.reference)


def paired_candidate(pair: PairedRecord, caller: RequestRecord) -> RequestRecord:
    """The shadow's answer to the caller's request, as a candidate record under the caller's id and labels."""
    ok = pair.shadow_status == 200 and not pair.shadow_error
    arrival = caller.arrival_s
    return RequestRecord(
        request_id=caller.request_id, revision=pair.shadow_revision, arm="candidate", arrival_s=arrival,
        outcome="ok" if ok else "error", route=pair.route, generation=pair.generation, tenant=caller.tenant,
        slices=dict(caller.slices),
        first_token_s=None if pair.shadow_ttft_s is None else arrival + pair.shadow_ttft_s,
        last_token_s=None if pair.shadow_e2e_s is None else arrival + pair.shadow_e2e_s,
        status_code=pair.shadow_status, error=pair.shadow_error, output_text=pair.shadow_output,
        reference=caller.reference, prompt_tokens=pair.shadow_prompt_tokens,
        output_tokens=pair.shadow_output_tokens, finish_reason=pair.shadow_finish_reason,
        caller_request_id=caller.caller_request_id,
    )
