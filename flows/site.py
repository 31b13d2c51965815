"""The site configuration: where each route's parts live, and the gate policies and plans by name.

A person asks for a rollout by names (route, candidate, policy, plan), on the Prefect UI's Run form
or with ``revgate promote ROUTE CANDIDATE``; the site configuration turns those names into the full
:class:`~flows.spec.PromotionSpec`. It is one JSON document on the machine that runs the flow (the
Prefect worker's host), found through ``$REVGATE_SITE`` or at ``revgate-site.json`` in the working
directory. Relative paths in it are relative to that working directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from revgate.flows.spec import (
    ENGINE_VENV_FIELD,
    LOCAL_RECORDS_FIELD,
    NO_AUTO_APPROVAL,
    PromotionSpec,
    auto_refused,
    local_records_problem,
    signers_problem,
)
from revgate.manifests.document import describe_validation_error
from revgate.manifests.errors import ManifestInvalid, RevgateError
from revgate.manifests.gates import GatePolicy
from revgate.manifests.jsonread import load_json
from revgate.manifests.revision import ExecutionConfig, InterfacePolicy
from revgate.manifests.rollout import RolloutPlan
from revgate.manifests.worker import WarmProfile
from revgate.serving.worker.request import SignaturePolicySpec

SITE_ENV = "REVGATE_SITE"
DEFAULT_SITE = "revgate-site.json"
DIGEST_PREFIX = "sha256:"
Named = TypeVar("Named")


class SiteConfigInvalid(RevgateError):
    """The site configuration is missing, malformed, or does not know a name a rollout asked for."""


class RouteSite(BaseModel):
    """One route's parts: the stores, the worker agent and router, the evidence sinks, the trust policy.

    The field names are :class:`PromotionSpec`'s, so a spec is these settings plus what a person chose.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    artifact_store: str = Field(description="artifact store URL: a directory or s3://bucket/prefix")
    route_store: str = Field(description="route store URL: a directory or s3://bucket/prefix")
    signature: SignaturePolicySpec = Field(description="who must have signed the candidate's artifact")
    worker_url: str = Field(description="the worker agent that runs the candidate's replica")
    more_workers: tuple[str, ...] = Field(default=(), description="the fleet's other worker agents")
    worker_token_file: str
    router_url: str
    router_admin_url: str
    more_routers: tuple[str, ...] = Field(default=(), description="admin URLs of the route's other routers")
    router_sync_s: float = Field(default=30.0, gt=0)
    ledger_wait_s: float = Field(default=1800.0, ge=0, description="after a decision, the longest wait for the "
                                 "evidence ledger to take what it held while away")
    router_admin_token_file: str
    records_sink: str = Field(min_length=1, description="where every router of the route writes its records (a "
                              "folder or s3://BUCKET/PREFIX): the flow's one evidence source")
    record_signers: dict[str, str] = Field(default_factory=dict, description="router id: its record-signing "
                                           "public key (PEM text or file); only these routers' signed objects count")
    router_records: str = LOCAL_RECORDS_FIELD
    engine_venv: str = ENGINE_VENV_FIELD
    paired_records: str = LOCAL_RECORDS_FIELD
    trace: str = Field(description="JSON-lines trace replayed through the router at each analysis step")
    probes: bool = True
    probe_concurrency: int | None = Field(default=4, ge=1)
    user_wait_s: float = Field(default=60.0, gt=0)
    judge_url: str = ""
    judge_model: str = ""
    batch_size: int = Field(default=200, ge=10)
    execution: ExecutionConfig = ExecutionConfig()
    interface: InterfacePolicy = InterfacePolicy()
    warm: WarmProfile = WarmProfile()
    tracking_uri: str
    evidence_root: str
    registered_model: str = Field(default="", description="the MLflow registered model of the route's "
                                  "revisions; empty: named after the route")
    approval: Literal["ui", "auto"] = Field(
        default="ui", description="'ui': each approve step pauses for a release manager in the Prefect UI; 'auto': "
        "approved without a person (demo and test sites; refused for plans that name approvers or ask for "
        "signatures). The site's, never the Run form's: whoever may start a run cannot skip its approvals")
    approval_timeout_s: int = Field(default=3600, ge=10)
    controller_key_file: str = Field(default="", description="the controller's PEM EC private key, on the host "
                                     "that runs the flow: it signs each decision (a release attestation)")
    controller_public_key: str = Field(default="", description="the controller's PEM public key (a file): what "
                                       "`revgate evidence --site` verifies release attestations with")
    policy: str = Field(description="the gate policy a rollout of this route uses when none is named")
    plan: str = Field(description="the rollout plan a rollout of this route uses when none is named")
    candidates: dict[str, str] = Field(default_factory=dict,
                                       description="candidate names a person may give instead of a digest")

    @model_validator(mode="after")
    def _no_local_records(self) -> RouteSite:
        if problem := local_records_problem(self):
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _signers_are_routers(self) -> RouteSite:
        if problem := signers_problem(self.record_signers, self.records_sink):
            raise ValueError(problem)
        return self


# The site's names and the auditor's key, not promotion parameters.
ROUTE_ONLY = frozenset({"policy", "plan", "candidates", "controller_public_key"})


class SiteConfig(BaseModel):
    """Every route this site rolls out, and the gate policies and rollout plans they may name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    routes: dict[str, RouteSite] = Field(min_length=1)
    policies: dict[str, GatePolicy] = Field(min_length=1)
    plans: dict[str, RolloutPlan] = Field(min_length=1)

    @model_validator(mode="after")
    def _names_resolve(self) -> SiteConfig:
        for name, route in self.routes.items():
            if route.policy not in self.policies:
                raise ValueError(f"route {name!r} names policy {route.policy!r}, which is not in policies")
            if route.plan not in self.plans:
                raise ValueError(f"route {name!r} names plan {route.plan!r}, which is not in plans")
            if auto_refused(route.approval, self.plans[route.plan]):
                raise ValueError(f"route {name!r}: {NO_AUTO_APPROVAL}")
            for candidate, digest in route.candidates.items():
                if not digest.startswith(DIGEST_PREFIX):
                    raise ValueError(f"route {name!r}: candidate {candidate!r} must name a sha256: manifest digest")
        return self


def site_path(given: str = "") -> Path:
    """Where the site configuration is: ``given``, else ``$REVGATE_SITE``, else ./revgate-site.json."""
    return Path(given or os.environ.get(SITE_ENV) or DEFAULT_SITE)


def load_site(path: Path) -> SiteConfig:
    """Read and validate the site configuration; SiteConfigInvalid names the file and each bad field."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SiteConfigInvalid(
            f"no site configuration readable ({error.strerror})", where=str(path),
            fix=f"Write one (docs/operations.md, 'Deploying rollouts') and point ${SITE_ENV} at it.",
        ) from None
    try:
        load_json(data, where=str(path))
        return SiteConfig.model_validate_json(data)
    except ManifestInvalid as error:
        raise SiteConfigInvalid(error.what, where=str(path), fix=error.fix) from None
    except ValidationError as error:
        raise SiteConfigInvalid(f"invalid site configuration: {describe_validation_error(error)}", where=str(path),
                                fix="Correct the named fields.") from None


def _named(kind: str, table: dict[str, Named], name: str, where: str) -> Named:
    if name not in table:
        known = ", ".join(sorted(table)) or "none"
        raise SiteConfigInvalid(f"no {kind} named {name!r}", where=where,
                                fix=f"Name one the site configuration has: {known}.")
    return table[name]


def candidate_digest(route: RouteSite, candidate: str, where: str) -> tuple[str, str]:
    """The candidate's pinned manifest digest and its name: a digest is taken as it is, a name is looked up."""
    if candidate.startswith(DIGEST_PREFIX):
        names = [name for name, digest in route.candidates.items() if digest == candidate]
        return candidate, names[0] if names else ""
    return _named("candidate", route.candidates, candidate, where), candidate


def promotion_spec(
    site: SiteConfig, route: str, candidate: str, *, policy: str = "", plan: str = "",
    created_by: str = "revgate promote",
) -> PromotionSpec:
    """The full promotion spec for what a person chose; SiteConfigInvalid for a name the site does not know."""
    settings = _named("route", site.routes, route, "site configuration: routes")
    digest, name = candidate_digest(settings, candidate, f"site configuration: routes.{route}.candidates")
    chosen = {field: getattr(settings, field) for field in RouteSite.model_fields if field not in ROUTE_ONLY}
    plan_name = plan or settings.plan
    document = {
        **chosen, "route": route, "candidate_manifest": digest, "candidate_name": name,
        "gate_policy": _named("gate policy", site.policies, policy or settings.policy, "site configuration: policies"),
        "plan": _named("rollout plan", site.plans, plan_name, "site configuration: plans"), "created_by": created_by,
    }
    try:
        return PromotionSpec.model_validate(document)
    except ValidationError as error:  # a plan chosen at run time may ask for what the route's settings cannot give
        raise SiteConfigInvalid(
            f"route {route!r} with plan {plan_name!r}: {describe_validation_error(error)}",
            where=f"site configuration: routes.{route}",
            fix="Choose a plan this route's settings can run, or change the route's settings.",
        ) from None
