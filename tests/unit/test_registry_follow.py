"""Following the route in the registry: the pure rules (the real store's test: test_registry_follows_route)."""

from __future__ import annotations

from datetime import UTC, datetime

from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import successor
from revgate.registry.follow import ROUTE_STATUS, disagreement, follow_route, stable_changes, with_route_status

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def snapshot(generation: int, fingerprint: str, by: str = "flow") -> RouteSnapshot:
    return RouteSnapshot.build(route="chat", generation=generation, created_by=by, created_at=NOW,
                               stable=RevisionTarget(fingerprint=fingerprint, endpoints=("http://127.0.0.1:8001",)))


class Registry:
    """The far side of follow_route: versions by fingerprint, one alias, the pages' status lines."""

    def __init__(self, versions: dict[str, str], stable: str | None) -> None:
        self.versions, self.stable = dict(versions), stable
        self.status: dict[str, tuple[str, str | None]] = {}
        self.moves: list[tuple[str, str, int]] = []

    def version_of(self, model: str, fingerprint: str) -> str | None:
        return next((v for v, f in self.versions.items() if f == fingerprint), None)

    def register_route_version(self, model: str, fingerprint: str, route: str, generation: int) -> str:
        version = str(len(self.versions) + 1)
        self.versions[version] = fingerprint
        return version

    def alias_target(self, model: str, alias: str) -> str | None:
        return self.stable

    def move_alias(self, model: str, alias: str, version: str, *, by: str, generation: int) -> None:
        self.stable = version
        self.moves.append((version, by, generation))

    def set_route_status(self, model: str, version: str, status: str, decision: str | None = None) -> None:
        self.status[version] = (status, decision)


def test_the_status_line_is_put_first_and_then_replaced_in_place() -> None:
    body = "**Decision: promoted** at 2026-12-01, approved by **dana**.\n\n- manifest digest `x`"
    once = with_route_status(body, f"{ROUTE_STATUS} stable at route generation 3 (written by flow).")
    assert once.startswith(f"{ROUTE_STATUS} stable at route generation 3") and body in once
    twice = with_route_status(once, f"{ROUTE_STATUS} no longer stable.")
    assert twice.count(ROUTE_STATUS) == 1 and twice.startswith(f"{ROUTE_STATUS} no longer stable.") and body in twice
    assert with_route_status("", "s").startswith("s")


def test_a_rollback_moves_the_alias_back_and_both_pages_say_so() -> None:
    registry = Registry({"1": A, "2": B}, stable="2")
    followed = follow_route(registry, "chat", snapshot(5, A, by="oncall"))
    assert (followed.moved, followed.previous, followed.version) == (True, "2", "1")
    assert registry.moves == [("1", "oncall", 5)]
    assert registry.status["1"][0].startswith(f"{ROUTE_STATUS} stable at route generation 5 (written by oncall)")
    assert registry.status["2"] == (f"{ROUTE_STATUS} no longer stable: replaced by {'a' * 12} at route generation 5 "
                                    "(written by oncall).", "rolled_back")


def test_an_alias_already_on_the_route_moves_nothing_and_a_revision_without_a_version_gets_one() -> None:
    registry = Registry({"1": A}, stable="1")
    assert not follow_route(registry, "chat", snapshot(2, A)).moved and registry.moves == []
    first = follow_route(Registry({}, stable=None), "chat", snapshot(1, B))
    assert (first.moved, first.previous, first.version) == (True, None, "1")
    assert "set to version 1" in first.line()


def test_stable_changes_keep_the_first_generation_and_each_change_of_stable() -> None:
    first = snapshot(1, A)
    renewed = successor(first, by="heartbeat", now=NOW)
    promoted = successor(renewed, by="flow", now=NOW, stable=RevisionTarget(
        fingerprint=B, endpoints=("http://127.0.0.1:8002",)))
    back = successor(promoted, by="oncall", now=NOW, stable=first.stable)
    assert [s.generation for s in stable_changes([back, promoted, renewed, first])] == [1, 3, 4]


def test_a_disagreement_names_both_sides() -> None:
    route = snapshot(7, A, by="oncall")
    assert disagreement("chat", A, route) is None
    said = disagreement("chat", B, route)
    assert said is not None and B[:19] in said and "a" * 12 in said and "generation 7" in said
    assert "names no version" in (disagreement("chat", None, route) or "")
