"""The request record: one line per attempt, written by the router and replay, read by the gates.

Kept free of heavy imports (no scipy, no pydantic on the write path) because the router writes one
per request. Times are Unix seconds as floats; records are evidence, not canonical documents.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Outcome = Literal["ok", "error", "timeout", "cancelled", "rejected"]
# A timeout record's error when the deadline was the caller's own shorter one (x-revgate-timeout-ms),
# not the route's: the caller's choice, never counted against the revision.
CALLER_DEADLINE = "the caller's deadline passed"
ROUTE_DEADLINE = "the request's deadline passed"
# A candidate's record made from a fallback (see RequestRecord.fallback_from): the error the gates read.
FALLBACK_ERROR = "fallback to stable: no replica of the revision took the request"
Arm = Literal["stable", "candidate", "shadow", "direct"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "error", "timeout", "cancelled", "rejected")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request attempt as seen by the component that served or replayed it."""

    request_id: str
    revision: str  # service revision fingerprint (sha256:...) or the upstream's served model name
    arm: Arm
    arrival_s: float
    outcome: Outcome
    attempt: int = 1
    route: str = ""
    generation: int = 0
    tenant: str = ""
    slices: dict[str, str] = field(default_factory=dict)
    endpoint: str = ""
    first_token_s: float | None = None
    last_token_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    status_code: int | None = None
    error: str = ""
    output_text: str | None = None
    reference: str | None = None
    caller_request_id: str = ""  # the caller's own x-request-id (request_id is the router's)
    # The revision the route assigned the request to, when none of its replicas could take it and stable served
    # it instead (a fallback): a failure of that revision in the gates, whatever stable answered.
    fallback_from: str = ""
    # A replay's record: the id the router gave the request, from its answer's x-request-id. The flow
    # joins its probes' labels on it: a caller can send any x-request-id, never the router's own.
    router_request_id: str = ""

    @property
    def ttft_s(self) -> float | None:
        """Arrival to first visible token."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(last - first) / (N - 1); undefined for fewer than two output tokens."""
        if self.first_token_s is None or self.last_token_s is None or not self.output_tokens:
            return None
        if self.output_tokens < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float | None:
        """Arrival to last token (or to the failure, when there was no token)."""
        return None if self.last_token_s is None else self.last_token_s - self.arrival_s

    def to_json(self) -> str:
        """One JSON line (no trailing newline)."""
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        """Parse one line written by :meth:`to_json`; unknown fields are an error."""
        data: dict[str, Any] = json.loads(line)
        return cls(**data)


def fallback_failure(record: RequestRecord) -> RequestRecord:
    """A fallback's record (``record.fallback_from`` set) as what it says about the revision it fell back from:
    that revision's own failure, with none of stable's timings or answer. The caller was served; the revision
    the route gave it to could not serve it, and a canary whose replicas are gone must not pass on stable's
    answers, nor look healthy because its requests stopped arriving."""
    return RequestRecord(
        request_id=record.request_id, revision=record.fallback_from, arm="candidate", arrival_s=record.arrival_s,
        outcome="error", attempt=record.attempt, route=record.route, generation=record.generation,
        tenant=record.tenant, slices=dict(record.slices), error=FALLBACK_ERROR, reference=record.reference,
        caller_request_id=record.caller_request_id, fallback_from=record.fallback_from,
    )


# --- whose outcome a record is ------------------------------------------------------------------
# A caller can make any revision fail its request: a malformed body or a context overflow (4xx), a
# deadline of 1 ms. Such outcomes are the caller's; charged to the arm that happened to serve them,
# one tenant could fail any canary (or mask a regression by spending them on stable). They are kept
# out of the revision's own failures and compared between the arms on their own: a revision that
# turns away requests the other serves (a smaller context window) still shows there.


def caller_4xx(record: RequestRecord) -> bool:
    """An answer in 400-499 other than the rejections (429 is one): the request was the caller's to fix."""
    return record.outcome != "rejected" and record.status_code is not None and 400 <= record.status_code < 500


def own_failure(record: RequestRecord) -> bool:
    """A failure of the revision itself: an upstream error or 5xx, or the route's deadline passing."""
    if record.outcome == "error":
        return not caller_4xx(record)
    return record.outcome == "timeout" and record.error != CALLER_DEADLINE


def callers_outcome(record: RequestRecord) -> bool:
    """A 4xx answer or the caller's own shorter deadline: what the caller chose, whichever arm served it."""
    return caller_4xx(record) or (record.outcome == "timeout" and record.error == CALLER_DEADLINE)


def counted(record: RequestRecord) -> bool:
    """Whether a record says anything about the revision's own health: answered, or failed by its own doing.

    A caller's 4xx, its own shorter deadline, a caller who left and a request the router refused
    (budgets) are the caller's or the router's: not counted either way.
    """
    if record.outcome == "ok":
        return not caller_4xx(record)
    return own_failure(record)
