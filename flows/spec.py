"""The parameters of a promotion: which candidate, on which route, against which policy and plan."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from manifests.gates import GatePolicy
from manifests.revision import ExecutionConfig, InterfacePolicy
from manifests.rollout import RolloutPlan, default_plan
from manifests.worker import WarmProfile
from serving.worker.request import SignaturePolicySpec


class PromotionSpec(BaseModel):
    """Everything ``promote_revision`` needs; the Prefect UI renders it as the run's parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    route: str
    candidate_manifest: str = Field(description="pinned artifact manifest digest (sha256:...)")
    candidate_name: str = ""
    artifact_store: str = Field(description="artifact store URL: a directory or s3://bucket/prefix")
    route_store: str = Field(description="route store URL: a directory or s3://bucket/prefix")
    signature: SignaturePolicySpec
    execution: ExecutionConfig = ExecutionConfig()
    interface: InterfacePolicy = InterfacePolicy()
    warm: WarmProfile = WarmProfile()
    gate_policy: GatePolicy
    plan: RolloutPlan = default_plan()
    worker_url: str
    worker_token_file: str
    router_url: str
    router_admin_url: str
    router_admin_token_file: str
    paired_records: str = Field(description="the router's shadow paired-records file")
    router_records: str = Field(default="", description="the router's request-records file: observed demand, "
                                "and the promoted revision's live traffic in the rollback window")
    trace: str = Field(description="JSON-lines trace replayed through the router at each analysis step")
    batch_size: int = Field(default=200, ge=10, description="requests between two looks of the gates")
    engine_venv: str = ".venv-engine"
    tracking_uri: str
    evidence_root: str
    registered_model: str = "revgate-model"
    approval: Literal["ui", "auto"] = Field(
        default="ui", description="'ui': pause for a release manager; 'auto': approve (demo and tests only)"
    )
    approval_timeout_s: int = Field(default=3600, ge=10)
    created_by: str = "revgate promote_revision"
