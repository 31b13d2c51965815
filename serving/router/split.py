"""Traffic assignment, as pure functions: canary split, lease expiry, shadow sampling.

The hot path reads a :class:`PinnedRoute` compiled once per snapshot, so a request costs one
hash and a few comparisons; nothing here does I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from revgate.manifests.route import PPM, RevisionTarget, RouteSnapshot

STABLE = "stable"
CANDIDATE = "candidate"
OUTCOMES = ("ok", "error", "timeout", "cancelled", "rejected")
Labels = tuple[tuple[str, str], ...]


def bucket_ppm(salt: bytes, key: bytes) -> int:
    """A uniform, deterministic position of ``key`` in [0, 1_000_000) under ``salt``.

    The router keys the hash once per snapshot (``_keyed``) and buckets each request with ``_bucket``;
    this is the same computation in one call.
    """
    return _bucket(_keyed(salt), key)


def _keyed(salt: bytes) -> Any:
    """A blake2b state keyed with ``salt``: copying it is cheaper than keying a new one per request.

    blake2b takes a key of at most 64 bytes; a longer salt is keyed by its digest, never cut: cut,
    every salt whose first 64 bytes agree (a route name of 56 characters or more, with any
    candidate's fingerprint after it) would put the same sessions on every canary.
    """
    key = salt if len(salt) <= 64 else hashlib.blake2b(salt, digest_size=64).digest()
    return hashlib.blake2b(digest_size=8, key=key)


def _bucket(keyed: Any, key: bytes) -> int:
    """``bucket_ppm`` from a state made by ``_keyed`` (the same value)."""
    state = keyed.copy()
    state.update(key)
    return int.from_bytes(state.digest(), "big") % PPM


@dataclass(frozen=True, slots=True)
class Target:
    """A revision as the router uses it: precomputed header bytes and endpoint order."""

    arm: str
    fingerprint: str
    endpoints: tuple[tuple[str, int], ...]
    urls: tuple[str, ...]
    served_model: str | None
    headers: bytes  # "x-revgate-revision: ...\r\nx-revgate-generation: ...\r\nx-revgate-arm: ...\r\n"
    short: str
    labels: Labels = ()  # metric labels: route and revision
    # The revision's interface policy (None: the route's values): output tokens, deadline, retries.
    max_output_tokens: int | None = None
    timeout_s: float | None = None
    max_retries: int | None = None
    outcome_labels: dict[str, Labels] = field(default_factory=dict, compare=False, hash=False)  # + arm, outcome


@dataclass(frozen=True, slots=True)
class PinnedRoute:
    """A validated snapshot compiled for the hot path; requests pin one of these at entry."""

    snapshot: RouteSnapshot
    stable: Target
    candidate: Target | None
    canary_salt: bytes
    canary_weight_ppm: int
    canary_expires_s: float
    shadow: Target | None
    shadow_salt: bytes
    shadow_sample_ppm: int
    shadow_expires_s: float
    side_effecting_tools: frozenset[str]
    failure_domains: dict[str, str]
    timeout_s: float
    max_retries: int
    credentials: frozenset[bytes]  # sha256 digests of the credentials whose bearers may declare evidence
    probe_digest: bytes  # the rollout's probe credential's digest (b"" outside a rollout)
    reveal: bool  # every caller's answer names its revision and arm
    canary_keyed: Any = field(compare=False, hash=False)  # _keyed(canary_salt)
    shadow_keyed: Any = field(compare=False, hash=False)  # _keyed(shadow_salt)

    def assign(self, key: bytes, now_s: float) -> Target:
        """Stable or candidate for a stickiness key; the candidate only inside its lease."""
        candidate = self.candidate
        if candidate is None or now_s >= self.canary_expires_s or self.canary_weight_ppm == 0:
            return self.stable
        if _bucket(self.canary_keyed, key) < self.canary_weight_ppm:
            return candidate
        return self.stable

    def trusts(self, credential: bytes | None) -> bool:
        """Whether a request's ``x-revgate-credential`` is the rollout's probe credential or a trusted source's."""
        if not credential or not self.credentials:
            return False
        return hashlib.sha256(credential).digest() in self.credentials

    def shadow_for(self, request_id: bytes, now_s: float) -> Target | None:
        """The shadow target if this request is sampled for mirroring and the lease holds."""
        shadow = self.shadow
        if shadow is None or now_s >= self.shadow_expires_s or self.shadow_sample_ppm == 0:
            return None
        if _bucket(self.shadow_keyed, request_id) < self.shadow_sample_ppm:
            return shadow
        return None


def _address(url: str) -> tuple[str, int]:
    host_port = url.removeprefix("http://").rstrip("/")
    host, _, port = host_port.rpartition(":")
    return host.strip("[]"), int(port)


def _target(arm: str, target: RevisionTarget, route: str, generation: int) -> Target:
    labels = (("route", route), ("revision", target.short))
    headers = (
        f"x-revgate-revision: {target.fingerprint}\r\nx-revgate-generation: {generation}\r\n"
        f"x-revgate-arm: {arm}\r\n"
    ).encode()
    limits = target.limits
    return Target(
        arm=arm,
        fingerprint=target.fingerprint,
        endpoints=tuple(_address(url) for url in target.endpoints),
        urls=target.endpoints,
        served_model=target.served_model,
        headers=headers,
        short=target.short,
        labels=labels,
        outcome_labels={outcome: (*labels, ("arm", arm), ("outcome", outcome)) for outcome in OUTCOMES},
        max_output_tokens=None if limits is None else limits.max_output_tokens,
        timeout_s=None if limits is None else limits.request_timeout_ms / 1000,
        max_retries=None if limits is None else limits.max_retries,
    )


def _digest_bytes(digest: str) -> bytes:
    """``sha256:<hex>`` as its 32 raw bytes (b"" for none)."""
    return bytes.fromhex(digest.removeprefix("sha256:")) if digest else b""


def compile_route(snapshot: RouteSnapshot) -> PinnedRoute:
    """Precompute everything a request needs from ``snapshot``."""
    candidate, shadow = snapshot.candidate, snapshot.shadow
    generation = snapshot.generation
    # The rollout's secret makes the cohort unknowable outside the route store: route and fingerprint
    # alone are public enough (answers named the revision) for a caller to compute its arm.
    secret = snapshot.cohort_secret
    canary_salt = f"{snapshot.route}|{candidate.fingerprint if candidate else ''}|{secret}".encode()
    shadow_salt = f"shadow|{snapshot.route}|{shadow.fingerprint if shadow else ''}|{secret}".encode()
    probe = _digest_bytes(snapshot.probe_credential)
    return PinnedRoute(
        snapshot=snapshot,
        stable=_target(STABLE, snapshot.stable, snapshot.route, generation),
        candidate=None if candidate is None else _target(CANDIDATE, candidate, snapshot.route, generation),
        # Salting with route and candidate keeps cohorts independent across candidates while a
        # weight ramp (1% -> 5%) only adds keys: a conversation never flips back.
        canary_salt=canary_salt,
        canary_weight_ppm=0 if candidate is None else candidate.weight_ppm,
        canary_expires_s=0.0 if candidate is None else candidate.lease_expires_at.timestamp(),
        shadow=None if shadow is None else _target("shadow", shadow, snapshot.route, generation),
        shadow_salt=shadow_salt,
        shadow_sample_ppm=0 if shadow is None else shadow.sample_ppm,
        shadow_expires_s=0.0 if shadow is None else shadow.lease_expires_at.timestamp(),
        side_effecting_tools=frozenset(() if shadow is None else shadow.side_effecting_tools),
        failure_domains=dict(snapshot.failure_domains),
        timeout_s=snapshot.request_timeout_ms / 1000,
        max_retries=snapshot.max_retries,
        credentials=frozenset(filter(None, (probe, *map(_digest_bytes, snapshot.trusted_sources)))),
        probe_digest=probe,
        reveal=snapshot.reveal_revision,
        canary_keyed=_keyed(canary_salt),
        shadow_keyed=_keyed(shadow_salt),
    )


def retry_order(target: Target, failure_domains: dict[str, str], first: int) -> list[int]:
    """Endpoint indexes to try: ``first``, then others in other failure domains before the same domain."""
    count = len(target.urls)
    order = [(first + step) % count for step in range(count)]
    home = failure_domains.get(target.urls[first])
    if home is None:
        return order
    return [order[0], *sorted(order[1:], key=lambda index: failure_domains.get(target.urls[index]) == home)]
