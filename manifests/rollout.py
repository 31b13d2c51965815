"""The rollout plan: a promotion as data, a list of steps (set weight, bake, analyse, approve).

Like Argo Rollouts' canary steps, but with evidence gates per step and the shadow stage in the
plan. Weights are integers in parts per million, as in route snapshots.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from revgate.manifests.document import API_VERSION, Document
from revgate.manifests.gates import Fraction, OpenFraction
from revgate.manifests.route import PPM


class Shadow(Document):
    """Mirror ``sample_ppm`` of stable traffic to the candidate; answers never reach callers."""

    step: Literal["shadow"] = "shadow"
    sample_ppm: Annotated[int, Field(gt=0, le=PPM)]


class SetWeight(Document):
    """Send ``weight_ppm`` of new requests to the candidate."""

    step: Literal["set_weight"] = "set_weight"
    weight_ppm: Annotated[int, Field(gt=0, le=PPM)]


class Bake(Document):
    """Hold the current weights for ``seconds`` before the next step."""

    step: Literal["bake"] = "bake"
    seconds: Annotated[int, Field(ge=0, le=7 * 24 * 3600)]


class Analyze(Document):
    """Run the gates on the evidence of the current stage, until decided or ``max_samples`` per arm."""

    step: Literal["analyze"] = "analyze"
    max_samples: Annotated[int, Field(ge=1)]
    # The most samples the power check may extend the stage to when ``max_samples`` would end it before
    # its gates can pass an equal revision (unset: never extended).
    extend_to: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _extends(self) -> Analyze:
        if self.extend_to is not None and self.extend_to < self.max_samples:
            raise ValueError("extend_to is smaller than max_samples: a stage is only ever extended")
        return self


class Approve(Document):
    """Pause for a release manager; the approval binds to the latest gate report's digest."""

    step: Literal["approve"] = "approve"
    prompt: str = "Approve the candidate for canary traffic?"


RolloutStep = Annotated[Shadow | SetWeight | Bake | Analyze | Approve, Field(discriminator="step")]


class PostPromotionCheck(Document):
    """What the rollback window watches on the promoted revision's live traffic (router records).

    Only the revision's own failures count: 5xx answers, upstream errors and the route's deadline;
    callers' 4xx, their own shorter deadlines, departures and the router's refusals do not. The
    window reverts once, with at least ``min_requests`` counted, a confidence sequence at ``alpha``
    (valid at every look) shows the promoted revision's failure rate above the old stable's (its
    traffic while both served, at most its own upper bound) by more than ``max_error_rate``, or its
    share of requests within the latency targets given below ``attainment`` (or below the old
    stable's, where stable itself fell short of it).
    """

    min_requests: Annotated[int, Field(ge=1)] = 20
    max_error_rate: Fraction = Decimal("0.05")  # the failure rate tolerated above the old stable's
    ttft_ms: Annotated[int, Field(gt=0)] | None = None
    e2e_ms: Annotated[int, Field(gt=0)] | None = None
    attainment: OpenFraction = Decimal("0.9")
    alpha: OpenFraction = Decimal("0.05")


class RolloutPlan(Document):
    """The ordered steps of a promotion, the candidate lease and its renewal, the capacity rule,
    and the rollback window with what it watches."""

    kind: Literal["RolloutPlan"] = "RolloutPlan"
    api_version: Literal["revgate/v1"] = API_VERSION
    steps: tuple[RolloutStep, ...] = Field(min_length=1)
    lease_seconds: Annotated[int, Field(ge=10)] = 900
    # The controller's heartbeat renews candidate and shadow leases this often (default: a third of the lease).
    lease_renew_seconds: Annotated[int, Field(ge=1)] | None = None
    # The heartbeat asks the agents about the candidate's replicas, and Prefect whether the run was
    # cancelled, this often, apart from renewal: a replica that dies is acted on within seconds, not
    # at the next renewal (a third of the lease by default). Never less often than the renewals.
    watch_every_seconds: Annotated[int, Field(ge=1)] = 5
    # Before each analysis stage the flow checks, from stable's measured rates, how likely every gate is
    # to pass an equal revision. With a target, a stage below it is extended (Analyze.extend_to) or
    # refused with the reason; unset, the check is only reported.
    power_target: OpenFraction | None = None
    rollback_window_seconds: Annotated[int, Field(ge=0)] = 3600
    post_promotion: PostPromotionCheck = PostPromotionCheck()
    # Capacity rule before every increase of candidate traffic: ready replicas of each revision
    # >= ceil(demand x share / (per-replica capacity x target_utilisation)).
    target_utilisation: OpenFraction = Decimal("0.8")
    # A failed capacity check pauses the rollout this long (re-checking) before it is rolled back.
    # Requests per second one ready replica carries, as profiled at load; unset: what each replica's
    # warm-up measured, which moves with the host's load (4 to 21 requests/s for one replica here).
    replica_capacity_rps: Annotated[Decimal, Field(gt=0)] | None = None
    capacity_wait_seconds: Annotated[int, Field(ge=0)] = 300
    on_inconclusive: Literal["pause", "fail"] = "pause"
    # Who may answer an approve step (names or e-mails, compared trimmed and case-insensitively).
    # Empty: anyone who can reach the approval form may answer. An answer from anyone else, approval
    # or rejection, decides nothing: it is kept in the evidence and the form is asked again.
    approvers: tuple[str, ...] = ()
    # Signed approvals: each answer must carry an OpenSSF model-signing signature (``revgate approve``)
    # over its approval statement, made with the private half of the named approver's public key in
    # ``approver_keys`` (approver -> PEM public key file, or the PEM text itself). An unsigned answer,
    # a bad signature, another approver's key or a statement about other evidence decides nothing.
    signed_approval: bool = False
    approver_keys: dict[str, str] = Field(default_factory=dict)
    # How many replicas of the candidate to start, spread over the spec's worker agents (one host each).
    # Unset: two where two agents have a free slot (two failure domains, so one lost host costs the
    # canary half its replicas, not all), else one.
    candidate_replicas: Annotated[int, Field(ge=1)] | None = None

    @property
    def renew_every_s(self) -> float:
        """The heartbeat period: the plan's, else a third of the lease."""
        return float(self.lease_renew_seconds or max(1, self.lease_seconds // 3))

    @property
    def watch_every_s(self) -> float:
        """How often the heartbeat watches the candidate and asks about a cancel: at least once a renewal."""
        return float(min(self.watch_every_seconds, self.renew_every_s))

    @model_validator(mode="after")
    def _renewal_inside_lease(self) -> RolloutPlan:
        if self.lease_renew_seconds is not None and self.lease_renew_seconds * 2 > self.lease_seconds:
            raise ValueError("lease_renew_seconds must be at most half of lease_seconds, so one missed renewal "
                             "does not drop the candidate")
        return self

    @field_validator("approvers")
    @classmethod
    def _approvers_named(cls, approvers: tuple[str, ...]) -> tuple[str, ...]:
        if any(not name.strip() or name != name.strip() for name in approvers):
            raise ValueError("approvers must be non-empty names without surrounding spaces")
        if len({name.casefold() for name in approvers}) != len(approvers):
            raise ValueError("approvers must not repeat a name (names are compared case-insensitively)")
        return approvers

    @model_validator(mode="after")
    def _keys_for_signed_approvers(self) -> RolloutPlan:
        listed = {name.casefold() for name in self.approvers}
        if strangers := sorted(name for name in self.approver_keys if name.casefold() not in listed):
            raise ValueError(f"approver_keys names {', '.join(strangers)}, not in approvers; list each key's "
                             "approver in approvers too")
        if any(not key.strip() for key in self.approver_keys.values()):
            raise ValueError("approver_keys values must be PEM public key files (or PEM text), not empty")
        if not self.signed_approval:
            return self
        if not self.approvers:
            raise ValueError("signed_approval needs approvers and a public key for each in approver_keys: "
                             "without them no signature can be checked")
        keyed = {name.casefold() for name in self.approver_keys}
        if missing := [name for name in self.approvers if name.casefold() not in keyed]:
            raise ValueError(f"signed_approval is on but approver_keys has no public key for {', '.join(missing)}; "
                             "add each approver's PEM public key, or take them off approvers")
        return self

    def approver_key(self, approver: str) -> str | None:
        """The public key (a PEM file, or PEM text) of ``approver``, compared trimmed and case-insensitively."""
        wanted = approver.strip().casefold()
        return next((key for name, key in self.approver_keys.items() if name.casefold() == wanted), None)

    @field_validator("steps")
    @classmethod
    def _weights_rise(cls, steps: tuple[RolloutStep, ...]) -> tuple[RolloutStep, ...]:
        weights = [step.weight_ppm for step in steps if isinstance(step, SetWeight)]
        if weights != sorted(weights) or len(set(weights)) != len(weights):
            raise ValueError("set_weight steps must strictly increase; a lower weight is a rollback, not a step")
        return steps


class ApprovalStatement(Document):
    """What a signed approval vouches for: this answer, by this person, to this paused flow run's form.

    ``revgate approve`` signs the statement's canonical JSON (as the one file ``approval.json`` of an
    OpenSSF model-signing signature); the flow checks it against the form it paused with.
    """

    kind: Literal["ApprovalStatement"] = "ApprovalStatement"
    api_version: Literal["revgate/v1"] = API_VERSION
    route: str = Field(min_length=1)
    flow_run_id: str = Field(min_length=1)
    evidence_digest: str
    approver: str = Field(min_length=1)
    approve: bool
    comment: str = ""


def default_plan(samples_per_stage: int = 2000) -> RolloutPlan:
    """Shadow, approval, then a 1% / 5% / 25% / 50% canary ladder with analysis at each step."""
    steps: list[Shadow | SetWeight | Bake | Analyze | Approve] = [
        Shadow(sample_ppm=100_000),
        Analyze(max_samples=samples_per_stage),
        Approve(),
    ]
    for weight in (10_000, 50_000, 250_000, 500_000):
        steps += [SetWeight(weight_ppm=weight), Bake(seconds=60), Analyze(max_samples=samples_per_stage)]
    return RolloutPlan(steps=tuple(steps))
