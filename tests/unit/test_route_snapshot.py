"""Route snapshots: strict validation, canonical identity, successor rule."""

from __future__ import annotations

from typing import Any

import pytest

from revgate.manifests.errors import ManifestInvalid
from revgate.manifests.route import RouteConflict, RouteSnapshot, check_successor

STABLE = "sha256:" + "a" * 64
CANDIDATE = "sha256:" + "b" * 64


def fields(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "route": "chat",
        "generation": 1,
        "stable": {"fingerprint": STABLE, "endpoints": ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]},
        "created_by": "release-bot",
        "created_at": "2026-11-29T10:00:00Z",
    }
    base.update(changes)
    return base


def canary(weight: int = 50_000, **changes: Any) -> dict[str, Any]:
    return {"fingerprint": CANDIDATE, "endpoints": ["http://127.0.0.1:9001"], "weight_ppm": weight,
            "lease_expires_at": "2026-11-29T11:00:00Z", **changes}


def test_valid_snapshot_round_trips_through_canonical_json() -> None:
    snapshot = RouteSnapshot.build(**fields(candidate=canary()))
    again = RouteSnapshot.from_json(snapshot.canonical())
    assert again == snapshot
    assert again.digest == snapshot.digest
    assert snapshot.candidate is not None and snapshot.candidate.weight_ppm == 50_000


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"candidate": canary(1_000_001)}, "weight_ppm"),
        ({"candidate": canary(-1)}, "weight_ppm"),
        ({"generation": 0}, "generation"),
        ({"route": "Chat Route"}, "route"),
        ({"created_by": ""}, "created_by"),
        ({"created_at": "2026-11-29T10:00:00"}, "created_at"),
        ({"stable": {"fingerprint": "abc", "endpoints": ["http://127.0.0.1:1"]}}, "fingerprint"),
        ({"stable": {"fingerprint": STABLE, "endpoints": []}}, "endpoints"),
        ({"stable": {"fingerprint": STABLE, "endpoints": ["http://h:1", "http://h:1"]}}, "unique"),
        ({"stable": {"fingerprint": STABLE, "endpoints": ["https://h:1"]}}, "scheme"),
        ({"stable": {"fingerprint": STABLE, "endpoints": ["http://h"]}}, "port"),
        ({"stable": {"fingerprint": STABLE, "endpoints": ["http://h:1/v1"]}}, "path"),
        ({"candidate": canary(endpoints=["http://127.0.0.1:8001"])}, "endpoint serves one revision"),
        ({"candidate": canary(fingerprint=STABLE)}, "different revision"),
        ({"failure_domains": {"http://127.0.0.1:7": "rack-a"}}, "failure_domains"),
        ({"max_retries": 9}, "max_retries"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_snapshot_is_refused_naming_the_problem(changes: dict[str, Any], named: str) -> None:
    with pytest.raises(ManifestInvalid) as caught:
        RouteSnapshot.build(**fields(**changes))
    assert named in str(caught.value)


def test_corrupt_json_is_a_typed_error_with_its_source() -> None:
    with pytest.raises(ManifestInvalid) as caught:
        RouteSnapshot.from_json(b'{"route": "chat", "generation": ', source="store/chat/current.json")
    assert "store/chat/current.json" in str(caught.value)


def test_successor_must_be_the_next_generation() -> None:
    first = RouteSnapshot.build(**fields())
    check_successor(None, first)
    check_successor(first, RouteSnapshot.build(**fields(generation=2)))
    with pytest.raises(RouteConflict) as caught:
        check_successor(first, RouteSnapshot.build(**fields(generation=3)))
    assert "generation 1" in str(caught.value) and "write generation 2" in str(caught.value)
    with pytest.raises(RouteConflict):
        check_successor(first, RouteSnapshot.build(**fields(generation=1)))
    with pytest.raises(RouteConflict):
        check_successor(None, RouteSnapshot.build(**fields(generation=2)))
