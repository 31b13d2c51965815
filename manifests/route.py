"""The route snapshot: which revision serves a route's traffic, at which generation.

A snapshot is immutable; a change of route is a new snapshot with the next generation, written
with compare-and-swap to a :class:`RouteStore`. Weights and sample rates are integers in parts
per million (ppm), because canonical documents carry no floats.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from revgate.manifests.canonical import DIGEST
from revgate.manifests.document import API_VERSION, Document
from revgate.manifests.errors import RevgateError

PPM = 1_000_000
ROUTE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ALL_TOOLS = "*"
COHORT_SECRET = re.compile(r"^[0-9a-f]{32,128}$")

Ppm = Annotated[int, Field(ge=0, le=PPM)]


class RouteConflict(RevgateError):
    """A compare-and-swap write found a different generation than the writer expected."""


class RouteNotFound(RevgateError):
    """The store holds no snapshot for the route."""


class RouteStoreUnavailable(RevgateError):
    """The route store could not be read or written (I/O, network, permissions)."""


def endpoint_problem(url: str) -> str | None:
    """Why ``url`` is not a usable upstream base URL (``http://host:port``), or None."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return "scheme must be http"
    if not parts.hostname:
        return "host is missing"
    try:
        port = parts.port
    except ValueError:
        return "port is not a number in 1..65535"
    if port is None:
        return "port is missing"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must be a base URL without path, query or fragment"
    return None


def _aware(value: datetime, name: str) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"{name} must carry a time zone (e.g. 2026-11-29T10:00:00Z)")
    return value


class ServingLimits(Document):
    """The pinned revision's interface policy, as every router enforces it on the requests that revision serves.

    Written by the flow from the revision's ``InterfacePolicy`` (part of its fingerprint): the limits a
    revision was gated under are the limits it serves under, whatever the route's own defaults say.
    """

    max_output_tokens: int = Field(ge=1)  # a request asking for more (or, on chat, for no limit) gets this many
    request_timeout_ms: int = Field(ge=1, le=3_600_000)  # the deadline, when shorter than the route's
    max_retries: int = Field(ge=0, le=5)  # attempts after the first on this revision's replicas
    side_effecting_tools: tuple[str, ...] = ()  # never mirrored to a shadow; empty: no request with tools is


class RevisionTarget(Document):
    """A service revision and the endpoints (replicas) that serve it."""

    fingerprint: str
    endpoints: tuple[str, ...] = Field(min_length=1)
    served_model: str | None = None  # when set, the router rewrites the request's "model" to it
    limits: ServingLimits | None = None  # the revision's interface policy; None: the route's defaults alone

    @field_validator("fingerprint")
    @classmethod
    def _fingerprint(cls, value: str) -> str:
        if not DIGEST.match(value):
            raise ValueError("fingerprint must be sha256:<64 hex>")
        return value

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            problem = endpoint_problem(url)
            if problem:
                raise ValueError(f"endpoint {url!r}: {problem}")
        if len({url.rstrip("/") for url in value}) != len(value):
            raise ValueError("endpoints must be unique")
        return tuple(url.rstrip("/") for url in value)

    @property
    def short(self) -> str:
        """First 12 hex characters of the fingerprint."""
        return self.fingerprint.removeprefix("sha256:")[:12]


class CanaryTarget(RevisionTarget):
    """The candidate revision taking ``weight_ppm`` of new requests until its lease expires."""

    weight_ppm: Ppm
    lease_expires_at: datetime

    @field_validator("lease_expires_at")
    @classmethod
    def _lease(cls, value: datetime) -> datetime:
        return _aware(value, "lease_expires_at")


class ShadowTarget(RevisionTarget):
    """A revision that receives a sampled copy of traffic whose answers are never returned."""

    sample_ppm: Ppm
    lease_expires_at: datetime
    # Requests that declare or call any of these tools are never mirrored; "*" means any tool.
    side_effecting_tools: tuple[str, ...] = (ALL_TOOLS,)

    @field_validator("lease_expires_at")
    @classmethod
    def _lease(cls, value: datetime) -> datetime:
        return _aware(value, "lease_expires_at")


class RouteSnapshot(Document):
    """One committed state of a route: stable, optional canary and shadow, and routing policy."""

    kind: Literal["RouteSnapshot"] = "RouteSnapshot"
    api_version: Literal["revgate/v1"] = API_VERSION
    route: str
    generation: int = Field(ge=1)
    stable: RevisionTarget
    candidate: CanaryTarget | None = None
    shadow: ShadowTarget | None = None
    failure_domains: dict[str, str] = Field(default_factory=dict)  # endpoint -> domain
    request_timeout_ms: int = Field(default=60_000, ge=1, le=3_600_000)
    max_retries: int = Field(default=1, ge=0, le=5)
    # Who may declare evidence about a request, and who learns which revision answered it. A caller
    # who could pick its slice, its probe status or its arm could fail any canary, or hide a
    # regression; so the router takes evidence labels (x-revgate-slices, -class, -task, metadata
    # revgate_*) only from a request whose x-revgate-credential hashes to one of these digests: the
    # rollout's probe credential, or a trusted gateway's (one that sets the header and strips it
    # from outside callers). Digests only: the route store never holds a credential itself.
    probe_credential: str = ""  # sha256:<hex> of the running rollout's probe credential; "" outside one
    trusted_sources: tuple[str, ...] = ()  # sha256:<hex> of each trusted gateway's credential
    # A per-rollout secret in the canary and shadow salts: without it the cohort of a candidate is
    # computable from the route's name and the candidate's fingerprint, and callers could pick their arm.
    cohort_secret: str = ""  # hex, 32 to 128 digits; "" outside a rollout
    # Whether every caller's answer names the revision, generation and arm that served it. Off by
    # default (the arm would tell a tenant which of its sessions to spend on the canary); requests
    # with a credential above always see them.
    reveal_revision: bool = False
    # The signed release decision this generation records (sha256 of the statement the controller signed): on a
    # rollout's deciding write only (promoted, rolled back); every other write leaves it empty (successor clears it).
    decision_attestation: str | None = None

    @field_validator("decision_attestation")
    @classmethod
    def _decision_attestation(cls, value: str | None) -> str | None:
        if value is not None and not DIGEST.match(value):
            raise ValueError("decision_attestation must be sha256:<64 hex>")
        return value

    created_by: str = Field(min_length=1)
    created_at: datetime

    @field_validator("route")
    @classmethod
    def _route(cls, value: str) -> str:
        if not ROUTE_NAME.match(value):
            raise ValueError("route must be 1-63 of a-z 0-9 . _ - starting with a letter or digit")
        return value

    @field_validator("probe_credential")
    @classmethod
    def _probe_credential(cls, value: str) -> str:
        if value and not DIGEST.match(value):
            raise ValueError("probe_credential must be sha256:<64 hex> (the credential's digest) or empty")
        return value

    @field_validator("trusted_sources")
    @classmethod
    def _trusted_sources(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if bad := [item for item in value if not DIGEST.match(item)]:
            raise ValueError(f"trusted_sources must be sha256:<64 hex> digests of credentials, not {bad[0]!r}")
        return value

    @field_validator("cohort_secret")
    @classmethod
    def _cohort_secret(cls, value: str) -> str:
        if value and not COHORT_SECRET.match(value):
            raise ValueError("cohort_secret must be 32 to 128 lowercase hex digits, or empty")
        return value

    @field_validator("created_at")
    @classmethod
    def _created_at(cls, value: datetime) -> datetime:
        return _aware(value, "created_at")

    @model_validator(mode="after")
    def _targets_consistent(self) -> RouteSnapshot:
        targets = self.targets()
        all_endpoints = [url for target in targets for url in target.endpoints]
        if len(set(all_endpoints)) != len(all_endpoints):
            raise ValueError("an endpoint serves one revision only: endpoints repeat across stable/candidate/shadow")
        fingerprints = [target.fingerprint for target in targets]
        if self.stable.fingerprint in fingerprints[1:]:
            raise ValueError("candidate and shadow must be a different revision than stable")
        unknown = sorted(set(self.failure_domains) - set(all_endpoints))
        if unknown:
            raise ValueError(f"failure_domains names endpoints not in this snapshot: {unknown}")
        return self

    def targets(self) -> list[RevisionTarget]:
        """Stable first, then the candidate and shadow when present."""
        optional = [self.candidate, self.shadow]
        return [self.stable, *(target for target in optional if target is not None)]


def check_successor(current: RouteSnapshot | None, proposed: RouteSnapshot, *, where: str = "") -> None:
    """Refuse ``proposed`` unless it is the next generation of ``current`` for the same route."""
    expected = 1 if current is None else current.generation + 1
    if current is not None and current.route != proposed.route:
        raise RouteConflict(
            f"snapshot is for route {proposed.route!r}, the store holds route {current.route!r}",
            where=where,
            fix="Write the snapshot under its own route name.",
        )
    if proposed.generation != expected:
        found = "no snapshot" if current is None else f"generation {current.generation}"
        raise RouteConflict(
            f"stale generation: the write is generation {proposed.generation}, which expects the store "
            f"at generation {proposed.generation - 1}, but the store holds {found}",
            where=where,
            fix=f"Re-read route {proposed.route!r}, re-apply the change on top, and write generation {expected}.",
        )


class RouteStore(Protocol):
    """Versioned route snapshots with compare-and-swap and an append-only history."""

    def read(self, route: str) -> RouteSnapshot | None:
        """The current snapshot, None if the route has none; ManifestInvalid if it is corrupt."""
        ...

    def write(self, snapshot: RouteSnapshot) -> None:
        """Commit ``snapshot`` if the store is at ``snapshot.generation - 1``; else RouteConflict."""
        ...

    def history(self, route: str) -> list[RouteSnapshot]:
        """Every committed generation, oldest first."""
        ...

    def back(self, route: str) -> Iterator[RouteSnapshot]:
        """The newest committed snapshot, then older generations one by one, each read only when asked for."""
        ...

    def routes(self) -> list[str]:
        """The names of the routes the store holds, sorted (replicas may be shared between them)."""
        ...
