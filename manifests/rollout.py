"""The rollout plan: a promotion as data, a list of steps (set weight, bake, analyse, approve).

Like Argo Rollouts' canary steps, but with evidence gates per step and the shadow stage in the
plan. Weights are integers in parts per million, as in route snapshots.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from manifests.document import API_VERSION, Document
from manifests.route import PPM


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


class Approve(Document):
    """Pause for a release manager; the approval binds to the latest gate report's digest."""

    step: Literal["approve"] = "approve"
    prompt: str = "Approve the candidate for canary traffic?"


RolloutStep = Annotated[Shadow | SetWeight | Bake | Analyze | Approve, Field(discriminator="step")]


class RolloutPlan(Document):
    """The ordered steps of a promotion, the candidate lease, and the rollback window."""

    kind: Literal["RolloutPlan"] = "RolloutPlan"
    api_version: Literal["revgate/v1"] = API_VERSION
    steps: tuple[RolloutStep, ...] = Field(min_length=1)
    lease_seconds: Annotated[int, Field(ge=10)] = 900
    rollback_window_seconds: Annotated[int, Field(ge=0)] = 3600
    on_inconclusive: Literal["pause", "fail"] = "pause"

    @field_validator("steps")
    @classmethod
    def _weights_rise(cls, steps: tuple[RolloutStep, ...]) -> tuple[RolloutStep, ...]:
        weights = [step.weight_ppm for step in steps if isinstance(step, SetWeight)]
        if weights != sorted(weights) or len(set(weights)) != len(weights):
            raise ValueError("set_weight steps must strictly increase; a lower weight is a rollback, not a step")
        return steps


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
