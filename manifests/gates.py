"""Gate policy and gate report documents.

A :class:`GatePolicy` states what a candidate must show against the stable revision in one stage:
quality margins per slice, SLO targets per request class, the error budget, the family-wise alpha,
minimum and maximum samples, and what an inconclusive result means. A :class:`GateReport` is the
decision with its numbers and the digest of the evidence it was computed from; an approval binds
to that digest.

Fractions are decimal strings ("0.05"), times are integer milliseconds: no floats in canonical form.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from revgate.manifests.canonical import DIGEST, decimal_from_text
from revgate.manifests.document import API_VERSION, Document

Outcome = Literal["pass", "fail", "inconclusive"]
LatencyMetric = Literal["ttft", "tpot", "e2e"]
Fraction = Annotated[Decimal, Field(ge=0, le=1)]
OpenFraction = Annotated[Decimal, Field(gt=0, lt=1)]
GraderKind = Literal[
    "reference", "json-schema", "regex", "not-refusal", "not-empty", "stop-reason", "length-ratio", "judge-pairwise"
]
PromptLength = Literal["short", "medium", "long"]
NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


_decimal_from_text = decimal_from_text


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


def _no_floats(value: Any, where: str = "json_schema") -> None:
    # A schema travels inside the canonical policy, which carries no floats.
    if isinstance(value, float):
        raise ValueError(f"{where}: a float in a canonical document; write an integer or a decimal string")
    if isinstance(value, dict):
        for key, item in value.items():
            _no_floats(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _no_floats(item, f"{where}[{index}]")


class PairedGrader(Document):
    """A label-free (or reference) grader feeding the paired quality gate on the slices it names.

    ``slices`` are slice names as the gate computes them, or ``"*"`` for every slice. Each kind
    needs its own settings: ``json_schema`` for json-schema, ``pattern`` for regex, ``min_ratio``
    and ``max_ratio`` (candidate length over stable's on the same prompt) for length-ratio,
    ``rubric`` for judge-pairwise; ``allowed_finish`` for stop-reason.
    """

    name: str
    kind: GraderKind
    slices: tuple[str, ...] = ("*",)
    json_schema: dict[str, Any] | None = None
    pattern: str | None = None
    min_ratio: Decimal | None = None
    max_ratio: Decimal | None = None
    rubric: str | None = None
    allowed_finish: tuple[str, ...] = ("stop",)

    _ratios = field_validator("min_ratio", "max_ratio", mode="before")(_decimal_from_text)

    @field_validator("json_schema")
    @classmethod
    def _schema_without_floats(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        _no_floats(value)
        return value

    @model_validator(mode="after")
    def _settings_of_kind(self) -> PairedGrader:
        if not NAME.match(self.name):
            raise ValueError("name must be lower-case letters, digits and '-'")
        needs: dict[str, tuple[str, ...]] = {"json-schema": ("json_schema",), "regex": ("pattern",)}
        needs |= {"judge-pairwise": ("rubric",), "length-ratio": ("min_ratio", "max_ratio")}
        missing = [f for f in needs.get(self.kind, ()) if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.kind} grader needs {', '.join(missing)}")
        if self.min_ratio is not None and self.max_ratio is not None and not 0 < self.min_ratio <= self.max_ratio:
            raise ValueError("length ratios need 0 < min_ratio <= max_ratio")
        if not self.slices:
            raise ValueError("slices is empty: name slices or '*'")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as error:
                raise ValueError(f"pattern does not compile: {error}") from None
        return self


class PairedPolicy(Document):
    """The shadow stage's paired gates: both revisions answered the same request.

    Quality: the mean of (stable score - candidate score) over pairs, per grader and slice, fails
    when shown above 0 and passes when shown below ``quality_margin``. Latency: the mean of
    log(candidate / stable) per pair fails when shown above log(1 + ``latency_margin``) and passes
    when shown below it, so the margin is the slowdown tolerated beyond measurement noise.
    ``max_pairs_per_stage`` and ``look_every`` plan the looks per slice (the sequential horizon).
    """

    quality_margin: Fraction = Decimal("0.02")
    latency_margin: Annotated[Decimal, Field(ge=0)] = Decimal("0.25")
    latency_metrics: tuple[LatencyMetric, ...] = ("ttft", "e2e")
    latency_slice_keys: tuple[str, ...] = ()
    max_pairs_per_stage: Annotated[int, Field(ge=1)] = 2000
    look_every: Annotated[int, Field(ge=1)] = 100
    # The latency gates' own horizon (None: max_pairs_per_stage). Latency is judged over all pairs
    # (or a few latency slices) while quality is judged per slice, so latency may look further.
    latency_max_pairs_per_stage: Annotated[int, Field(ge=1)] | None = None
    graders: tuple[PairedGrader, ...] = ()  # none: the stage's own reference grading feeds the gate

    _fractions = field_validator("quality_margin", "latency_margin", mode="before")(_decimal_from_text)

    @property
    def latency_horizon(self) -> int:
        """Pairs per latency slice at the last planned look."""
        return self.latency_max_pairs_per_stage or self.max_pairs_per_stage

    @model_validator(mode="after")
    def _consistent(self) -> PairedPolicy:
        if self.look_every > self.max_pairs_per_stage:
            raise ValueError("look_every is larger than max_pairs_per_stage: no look would happen")
        if self.look_every > self.latency_horizon:
            raise ValueError("look_every is larger than latency_max_pairs_per_stage: no latency look would happen")
        names = [g.name for g in self.graders]
        if len(set(names)) != len(names):
            raise ValueError("two graders share a name")
        return self


class SliceRule(Document):
    """Requests whose features all match the rule's set fields belong to ``slice`` (first rule wins)."""

    slice: str
    route: str | None = None
    tenant: str | None = None
    request_class: str | None = None
    task: str | None = None
    prompt_length: PromptLength | None = None

    @model_validator(mode="after")
    def _named(self) -> SliceRule:
        if not self.slice or "/" in self.slice:
            raise ValueError("slice must be a non-empty name without '/'")
        return self


class Slicing(Document):
    """How live requests map to slices: features (route, tenant, request class, declared task, prompt length).

    The request class and task are read from the request's declared labels under ``class_key`` and
    ``task_key``; prompt length buckets are short (< ``short_below`` tokens), medium (<
    ``long_from``) and long. A request no rule matches lands in the ``unmatched`` slice and is
    reported, never dropped.
    """

    rules: tuple[SliceRule, ...]
    class_key: str = "class"
    task_key: str = "task"
    short_below: Annotated[int, Field(ge=1)] = 256
    long_from: Annotated[int, Field(ge=1)] = 2048
    unmatched: str = "unmatched"

    @model_validator(mode="after")
    def _consistent(self) -> Slicing:
        if self.short_below > self.long_from:
            raise ValueError("short_below is larger than long_from")
        if self.unmatched in {rule.slice for rule in self.rules}:
            raise ValueError(f"a rule names the reserved slice {self.unmatched!r}")
        return self


DEFAULT_MARGIN_MIN = Decimal("0.005")


class GatePolicy(Document):
    """What a candidate must show in one stage, and how the evidence is tested."""

    kind: Literal["GatePolicy"] = "GatePolicy"
    api_version: Literal["revgate/v1"] = API_VERSION
    alpha: OpenFraction = Decimal("0.05")
    quality_margin: Fraction = Decimal("0.02")
    error_margin: Fraction = Decimal("0.01")
    latency_margin: Fraction = Decimal("0.1")  # tolerated relative slowdown (0.10 = 10 %)
    # Fail latency only when the candidate is shown slower than this (0.2 = 1.2x stable's); unset: shown
    # slower at all. Replicas on different hosts or cores differ by some amount whatever they serve.
    latency_fail_above: Fraction | None = None
    latency_metrics: tuple[LatencyMetric, ...] = ("ttft", "e2e")
    slice_keys: tuple[str, ...] = ()
    slo: tuple[SloTarget, ...] = ()
    hard_constraints: tuple[HardConstraint, ...] = ()
    min_samples_per_slice: Annotated[int, Field(ge=1)] = 30
    critical_slices: tuple[str, ...] = ()
    max_samples_per_stage: Annotated[int, Field(ge=1)] = 2000  # per arm and slice: the sequential horizon
    look_every: Annotated[int, Field(ge=1)] = 100
    # The two-sample latency gates' own horizon and look spacing (unset: the two above). Latency is one
    # series per arm, not one per slice, and a host's transient load skews a short window: looking
    # later and further averages it out (see flows/demo.py).
    latency_max_samples_per_stage: Annotated[int, Field(ge=1)] | None = None
    latency_look_every: Annotated[int, Field(ge=1)] | None = None
    srm_alpha: OpenFraction = Decimal("0.001")
    # Margins relative to stable's rate: a slice's quality margin is this share of stable's error rate on
    # it (0.5: at most 1.5x stable's wrong answers), within [quality_margin_min, quality_margin]. A 24%
    # slice and a 99% slice are not judged by the same points. Unset: quality_margin on every slice.
    quality_margin_relative: OpenFraction | None = None
    quality_margin_min: Fraction | None = None  # the floor of a relative margin (unset: 0.005)
    # Futility: a two-sample comparison stops, inconclusive, at a look where the chance of passing by
    # the horizon (were the candidate equal from then on) is below this; unset: no futility stop.
    futility_below: OpenFraction | None = None
    # False: quality is judged on pairs only (the shadow stage), not by two-sample tests in the canary,
    # where each arm answers other prompts and a hard slice needs several times more samples.
    two_sample_quality: bool | None = None
    on_inconclusive: Literal["pause", "fail"] = "pause"
    paired: PairedPolicy | None = None  # shadow stage: paired gates instead of two-sample ones
    slicing: Slicing | None = None  # live traffic: slices from request features instead of slice_keys

    _fractions = field_validator(
        "alpha", "quality_margin", "error_margin", "latency_margin", "latency_fail_above", "srm_alpha",
        "futility_below", "quality_margin_relative", "quality_margin_min", mode="before"
    )(_decimal_from_text)

    def margin_for(self, stable_rate: float | None) -> float:
        """The quality margin of a slice where stable's graded rate is ``stable_rate`` (None: not measured)."""
        ceiling = float(self.quality_margin)
        if self.quality_margin_relative is None or stable_rate is None:
            return ceiling
        floor = float(self.quality_margin_min if self.quality_margin_min is not None else DEFAULT_MARGIN_MIN)
        return min(ceiling, max(floor, float(self.quality_margin_relative) * (1.0 - stable_rate)))

    @property
    def latency_horizon(self) -> int:
        """The most samples per arm the two-sample latency gates look at in one stage."""
        return self.latency_max_samples_per_stage or self.max_samples_per_stage

    @property
    def latency_look_interval(self) -> int:
        """Samples per arm between the two-sample latency gates' looks."""
        return self.latency_look_every or self.look_every

    @model_validator(mode="after")
    def _consistent(self) -> GatePolicy:
        if self.look_every > self.max_samples_per_stage:
            raise ValueError("look_every is larger than max_samples_per_stage: no look would happen")
        if self.latency_fail_above is not None and self.latency_fail_above > self.latency_margin:
            raise ValueError("latency_fail_above is larger than latency_margin: a slowdown between them would "
                             "neither pass nor fail")
        if self.latency_look_interval > self.latency_horizon:
            raise ValueError("latency_look_every is larger than the latency horizon (latency_max_samples_per_stage, "
                             "else max_samples_per_stage): no latency look would happen")
        if self.quality_margin_min is not None and self.quality_margin_min > self.quality_margin:
            raise ValueError("quality_margin_min is larger than quality_margin: a relative margin would have no room")
        if self.min_samples_per_slice > self.max_samples_per_stage:
            raise ValueError("min_samples_per_slice is larger than max_samples_per_stage: no slice could pass")
        if len(set(self.slice_keys)) != len(self.slice_keys):
            raise ValueError("slice_keys repeats a key")
        if self.paired is not None and self.paired.graders:
            covered = {s for g in self.paired.graders for s in g.slices}
            untested = [c for c in self.critical_slices if "*" not in covered and c not in covered]
            if untested:
                raise ValueError(f"no paired grader feeds the critical slices {', '.join(untested)}")
        return self

    @model_serializer(mode="wrap")
    def _without_unset_sections(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Sections added later are left out while unset, so a policy written before them keeps its digest.
        data: dict[str, Any] = handler(self)
        later = ("paired", "slicing", "latency_fail_above", "latency_max_samples_per_stage", "latency_look_every",
                 "futility_below", "two_sample_quality", "quality_margin_relative", "quality_margin_min")
        return {k: v for k, v in data.items() if not (k in later and v is None)}


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
