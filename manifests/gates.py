"""Gate policy and gate report documents.

A :class:`GatePolicy` states what a candidate must show against the stable revision in one stage:
quality margins per slice, SLO targets per request class, the error budget, the family-wise alpha,
minimum and maximum samples, and what an inconclusive result means. A :class:`GateReport` is the
decision with its numbers and the digest of the evidence it was computed from; an approval binds
to that digest.

Fractions are decimal strings ("0.05"), times are integer milliseconds: no floats in canonical form.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from manifests.canonical import DIGEST
from manifests.document import API_VERSION, Document

Outcome = Literal["pass", "fail", "inconclusive"]
LatencyMetric = Literal["ttft", "tpot", "e2e"]
Fraction = Annotated[Decimal, Field(ge=0, le=1)]
OpenFraction = Annotated[Decimal, Field(gt=0, lt=1)]


def _decimal_from_text(value: object) -> object:
    # Strict mode refuses strings for Decimal; fractions travel as decimal strings, normalised so
    # that "0.05" and "0.050" are one identity. A float would carry binary noise into the digest.
    if isinstance(value, float):
        raise ValueError('write fractions as decimal strings ("0.05"), not floats')
    return Decimal(value).normalize() if isinstance(value, (str, Decimal)) else value


class SloTarget(Document):
    """Pr(TTFT <= ttft_ms and TPOT <= tpot_ms and E2E <= e2e_ms | admitted) >= attainment, per request class.

    ``request_class`` selects requests by a slice label (``"key=value"``); ``"*"`` selects all.
    A threshold left out does not constrain that metric.
    """

    request_class: str = "*"
    ttft_ms: Annotated[int, Field(gt=0)] | None = None
    tpot_ms: Annotated[int, Field(gt=0)] | None = None
    e2e_ms: Annotated[int, Field(gt=0)] | None = None
    attainment: OpenFraction

    _attainment = field_validator("attainment", mode="before")(_decimal_from_text)

    @model_validator(mode="after")
    def _some_threshold(self) -> SloTarget:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("an SLO target needs at least one of ttft_ms, tpot_ms, e2e_ms")
        if self.request_class != "*" and "=" not in self.request_class:
            raise ValueError("request_class must be '*' or 'key=value'")
        return self


class HardConstraint(Document):
    """A bound on one candidate metric; a metric that cannot be measured counts as a violation."""

    metric: str  # a key of the candidate's metric summary, e.g. "error_rate", "ttft_p99_ms"
    maximum: Decimal | None = None
    minimum: Decimal | None = None

    _bounds = field_validator("maximum", "minimum", mode="before")(_decimal_from_text)

    @model_validator(mode="after")
    def _some_bound(self) -> HardConstraint:
        if self.maximum is None and self.minimum is None:
            raise ValueError("a hard constraint needs a maximum or a minimum")
        return self


class GatePolicy(Document):
    """What a candidate must show in one stage, and how the evidence is tested."""

    kind: Literal["GatePolicy"] = "GatePolicy"
    api_version: Literal["revgate/v1"] = API_VERSION
    alpha: OpenFraction = Decimal("0.05")
    quality_margin: Fraction = Decimal("0.02")
    error_margin: Fraction = Decimal("0.01")
    latency_margin: Fraction = Decimal("0.1")  # tolerated relative slowdown (0.10 = 10 %)
    latency_metrics: tuple[LatencyMetric, ...] = ("ttft", "e2e")
    slice_keys: tuple[str, ...] = ()
    slo: tuple[SloTarget, ...] = ()
    hard_constraints: tuple[HardConstraint, ...] = ()
    min_samples_per_slice: Annotated[int, Field(ge=1)] = 30
    critical_slices: tuple[str, ...] = ()
    max_samples_per_stage: Annotated[int, Field(ge=1)] = 2000  # per arm and slice: the sequential horizon
    look_every: Annotated[int, Field(ge=1)] = 100
    srm_alpha: OpenFraction = Decimal("0.001")
    on_inconclusive: Literal["pause", "fail"] = "pause"

    _fractions = field_validator(
        "alpha", "quality_margin", "error_margin", "latency_margin", "srm_alpha", mode="before"
    )(_decimal_from_text)

    @model_validator(mode="after")
    def _consistent(self) -> GatePolicy:
        if self.look_every > self.max_samples_per_stage:
            raise ValueError("look_every is larger than max_samples_per_stage: no look would happen")
        if self.min_samples_per_slice > self.max_samples_per_stage:
            raise ValueError("min_samples_per_slice is larger than max_samples_per_stage: no slice could pass")
        if len(set(self.slice_keys)) != len(self.slice_keys):
            raise ValueError("slice_keys repeats a key")
        return self


class SliceResult(Document):
    """One slice's outcome within a gate, with its numbers as decimal strings."""

    slice: str
    outcome: Outcome
    reason: str
    numbers: dict[str, str] = Field(default_factory=dict)


class GateResult(Document):
    """One gate's outcome: pass, fail or inconclusive, why, and the numbers it used."""

    gate: str
    outcome: Outcome
    reason: str
    numbers: dict[str, str] = Field(default_factory=dict)
    slices: tuple[SliceResult, ...] = ()


class ArmVolume(Document):
    """Evidence volume of one arm, in requests and in tokens (a request share is not a token share)."""

    requests: Annotated[int, Field(ge=0)]
    admitted: Annotated[int, Field(ge=0)]
    rejected: Annotated[int, Field(ge=0)]
    prompt_tokens: Annotated[int, Field(ge=0)]
    output_tokens: Annotated[int, Field(ge=0)]


class GateReport(Document):
    """The joint decision over every gate, bound to the policy and to the evidence it read."""

    kind: Literal["GateReport"] = "GateReport"
    api_version: Literal["revgate/v1"] = API_VERSION
    outcome: Outcome
    policy_digest: str
    evidence_digest: str
    stable_revision: str
    candidate_revision: str
    stable: ArmVolume
    candidate: ArmVolume
    gates: tuple[GateResult, ...]
    notes: tuple[str, ...] = ()

    @field_validator("policy_digest", "evidence_digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        if not DIGEST.match(value):
            raise ValueError("must be sha256:<64 hex>")
        return value

    def failed(self) -> tuple[GateResult, ...]:
        """The gates that failed."""
        return tuple(gate for gate in self.gates if gate.outcome == "fail")
