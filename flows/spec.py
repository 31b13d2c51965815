"""The parameters of a promotion: which candidate, on which route, against which policy and plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from revgate.manifests.gates import GatePolicy
from revgate.manifests.revision import ExecutionConfig, InterfacePolicy
from revgate.manifests.rollout import RolloutPlan, default_plan
from revgate.manifests.worker import WarmProfile
from revgate.registry.record_signing import PEM_START, RecordKeyInvalid, load_public_key
from revgate.registry.record_store import ROUTER_ID
from revgate.serving.worker.request import SignaturePolicySpec

NO_AUTO_APPROVAL = ("approval 'auto' is refused for a rollout plan that names approvers or asks for signed approvals: "
                    "its approve steps need those people; give such routes approval 'ui'")


def auto_refused(approval: str, plan: RolloutPlan) -> bool:
    """Whether ``approval`` would answer for people the plan names (its approvers, or signed approvals)."""
    return approval == "auto" and bool(plan.approvers or plan.signed_approval)


LOCAL_RECORDS = ("router_records", "paired_records")


LOCAL_RECORDS_FIELD = Field(default="", exclude=True, description="no longer read: refused unless empty "
                            "(every router writes to records_sink, the flow's one evidence source)")


ENGINE_VENV_FIELD = Field(default="", exclude=True, description="no longer read: refused unless empty (the "
                          "engine build is the worker agents')")


def local_records_problem(document: BaseModel) -> str:
    """What is wrong when a document still names one router's local records files, or the controller's engine
    environment ("" when nothing).

    Those files hold one router's share of the traffic: a capacity rule or a rollback window reading
    them sees 1/R of the demand with R routers, and nothing where records go to S3.
    """
    if getattr(document, "engine_venv", ""):
        return ("engine_venv: the controller needs no engine environment any more; the flow pins the engine build "
                "the worker agents report (GET /v1/engine): drop engine_venv")
    named = [key for key in LOCAL_RECORDS if getattr(document, key)]
    if not named:
        return ""
    return (f"{', '.join(named)}: the flow reads no router's local files any more; every router writes to the record "
            "sink and the flow reads the stages, the capacity rule's demand and the rollback window from it: give "
            "records_sink (revgate router --records-sink) and drop " + ", ".join(named))


def signers_problem(signers: Mapping[str, str], records_sink: str) -> str:
    """What is wrong with a route's record signers ("" when nothing): ids routers can have, keys given as PEM text
    that load (a key file is read where the flow runs), and a record sink for them to sign into."""
    for router, key in signers.items():
        if not ROUTER_ID.match(router):
            return f"record_signers names {router!r}, which is no router id (letters, digits, '.', '_' or '-')"
        if key.lstrip().startswith(PEM_START):
            try:
                load_public_key(key, f"record_signers.{router}")
            except RecordKeyInvalid as error:
                return str(error)
    if signers and not records_sink:
        return "record_signers needs records_sink: they say whose objects in it count"
    return ""


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
    more_workers: tuple[str, ...] = Field(
        default=(), description="the rest of the fleet: more worker agents (one per host, each its own failure "
        "domain) the candidate's replicas are spread over, with worker_url; they share worker_token_file")
    worker_token_file: str
    router_url: str
    router_admin_url: str
    more_routers: tuple[str, ...] = Field(
        default=(), description="admin URLs of the route's other routers (one token file for all): each is told "
        "of every new generation, and a step counts as applied once every router serves it")
    drain_wait_s: float = Field(default=60.0, gt=0, description="the longest wait, before a stage starts "
                                "counting, for both arms' engines to finish the previous stage's work")
    ledger_wait_s: float = Field(default=1800.0, ge=0, description="after the decision, the longest wait for "
                                 "the evidence ledger to take the writes it held while away; the run is closed then")
    router_sync_s: float = Field(default=30.0, gt=0, description="the longest wait for every router to serve "
                                 "a new generation; a router still behind then stops the rollout")
    router_admin_token_file: str
    records_sink: str = Field(min_length=1, description="the routers' record sink (a folder or s3://BUCKET/PREFIX): "
                              "the one evidence source. Every router of the route writes its records to it; the "
                              "stages, the capacity rule's demand and the rollback window read them from there")
    record_signers: dict[str, str] = Field(
        default_factory=dict, description="the routers whose records count, each router id with its Ed25519 "
        "public key (PEM text, or a PEM file): only their signed objects are read; empty: every object in the "
        "record sink is believed (one machine)")
    router_records: str = LOCAL_RECORDS_FIELD
    engine_venv: str = ENGINE_VENV_FIELD
    paired_records: str = LOCAL_RECORDS_FIELD
    trace: str = Field(description="JSON-lines trace replayed through the router at each analysis step")
    probes: bool = Field(default=True, description="replay the trace as probe traffic; off: the gates judge "
                         "the users' traffic alone")
    probe_concurrency: int | None = Field(
        default=4, ge=1, description="most probe requests in flight at once (None: the trace's own open-loop "
        "rate). In shadow the router mirrors with a few workers, so probes flooding stable would measure "
        "stable under a load the shadow never sees; keep it at the routers' shadow concurrency")
    user_wait_s: float = Field(default=60.0, gt=0, description="without probes: the longest wait for a batch "
                               "of users' requests between two looks of the gates")
    judge_url: str = Field(default="", description="OpenAI-compatible /v1 of the judge for judge-pairwise graders")
    judge_model: str = ""
    batch_size: int = Field(default=200, ge=10, description="requests between two looks of the gates")
    tracking_uri: str
    evidence_root: str
    registered_model: str = Field(default="", description="the MLflow registered model of the route's "
                                  "revisions; empty: named after the route")
    approval: Literal["ui", "auto"] = Field(
        default="ui", description="'ui': pause for a release manager; 'auto': approve (demo and tests only)"
    )
    approval_timeout_s: int = Field(default=3600, ge=10)
    controller_key_file: str = Field(
        default="", description="the controller's PEM EC private key (P-256, P-384 or P-521): each decision is "
        "signed with it as a release attestation; empty: decisions are recorded unsigned (the audit says so)")
    created_by: str = "revgate promote_revision"

    @property
    def model_name(self) -> str:
        """The registered model the route's revisions are versions of: ``registered_model``, or the route's name."""
        return self.registered_model or self.route

    def workers(self) -> tuple[str, ...]:
        """Every worker agent of the fleet, worker_url first, each once."""
        return tuple(dict.fromkeys(url.rstrip("/") for url in (self.worker_url, *self.more_workers)))

    def routers(self) -> tuple[str, ...]:
        """Every router's admin URL, router_admin_url first, each once."""
        return tuple(dict.fromkeys(url.rstrip("/") for url in (self.router_admin_url, *self.more_routers)))

    @model_validator(mode="after")
    def _approval_has_its_people(self) -> PromotionSpec:
        # A plan that names approvers or asks for signatures asks for a person: nothing may answer for them.
        if auto_refused(self.approval, self.plan):
            raise ValueError(NO_AUTO_APPROVAL)
        return self

    @model_validator(mode="after")
    def _signers_are_routers(self) -> PromotionSpec:
        if problem := signers_problem(self.record_signers, self.records_sink):
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _no_local_records(self) -> PromotionSpec:
        if problem := local_records_problem(self):
            raise ValueError(problem)
        return self
