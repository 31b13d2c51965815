"""The model registry follows the route: the ``stable`` alias names the version of the revision the route
serves as stable, whoever wrote the generation that changed it (a promotion, a rollback window's revert,
an operator's ``revgate rollback``), and each version's page says where its revision stands now.

MLflow is the auditor's view, never the source of truth: the route store is. So the registry is brought
to the route (:func:`follow_route`) after each write that can change the stable revision, and
``revgate evidence`` names any disagreement that is left (a rollback taken with MLflow down).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from revgate.manifests.route import RouteSnapshot

ROUTE_STATUS = "**Route now:**"  # the first line of a version's description, rewritten as the route moves


class Registry(Protocol):
    """What following the route needs of the ledger (registry.ledger.EvidenceLedger)."""

    def version_of(self, model: str, fingerprint: str) -> str | None: ...

    def register_route_version(self, model: str, fingerprint: str, route: str, generation: int) -> str: ...

    def alias_target(self, model: str, alias: str) -> str | None: ...

    def move_alias(self, model: str, alias: str, version: str, *, by: str, generation: int) -> None: ...

    def set_route_status(self, model: str, version: str, status: str, decision: str | None = None) -> None: ...


@dataclass(frozen=True)
class Followed:
    """What following the route did: the version the ``stable`` alias names now, and the one it left."""

    model: str
    version: str
    moved: bool
    previous: str | None  # the version the alias named before a move (None: the alias was new)
    generation: int

    def line(self) -> str:
        """One line for a terminal or a flow's log."""
        if not self.moved:
            return f"registry: {self.model} alias stable already names version {self.version}"
        origin = "set" if self.previous is None else f"moved from version {self.previous}"
        return (f"registry: {self.model} alias stable {origin} to version {self.version} "
                f"(route generation {self.generation})")


def became_stable(route: RouteSnapshot) -> str:
    """The route status of the version the route serves as stable now."""
    return f"{ROUTE_STATUS} stable at route generation {route.generation} (written by {route.created_by})."


def replaced(route: RouteSnapshot) -> str:
    """The route status of the version the route stopped serving as stable."""
    return (f"{ROUTE_STATUS} no longer stable: replaced by {route.stable.short} at route generation "
            f"{route.generation} (written by {route.created_by}).")


def with_route_status(description: str, status: str) -> str:
    """``description`` with its route-status line set to ``status`` (the line replaced, or put first)."""
    lines = (description or "").splitlines()
    kept = lines[2:] if lines and lines[0].startswith(ROUTE_STATUS) else lines
    return "\n".join([status, "", *kept]).rstrip() + "\n"


def follow_route(registry: Registry, model: str, route: RouteSnapshot) -> Followed:
    """Point ``model``'s ``stable`` alias at the version of ``route``'s stable revision.

    A revision with no version yet (the route's first stable, set up outside revgate) is registered
    without a promotion run. The versions on both sides of a move say so on their pages.
    """
    fingerprint = route.stable.fingerprint
    version = registry.version_of(model, fingerprint)
    if version is None:
        version = registry.register_route_version(model, fingerprint, route.route, route.generation)
    previous = registry.alias_target(model, "stable")
    if previous == version:
        return Followed(model, version, False, previous, route.generation)
    registry.move_alias(model, "stable", version, by=route.created_by, generation=route.generation)
    registry.set_route_status(model, version, became_stable(route))
    if previous is not None:
        registry.set_route_status(model, previous, replaced(route), decision="rolled_back")
    return Followed(model, version, True, previous, route.generation)


def disagreement(model: str, alias_fingerprint: str | None, route: RouteSnapshot) -> str | None:
    """Why the registry and the route disagree about the stable revision; None when they agree."""
    if alias_fingerprint == route.stable.fingerprint:
        return None
    named = "names no version" if alias_fingerprint is None else f"names revision {alias_fingerprint[:19]}"
    return (f"{model}'s alias stable {named}, but route {route.route} serves {route.stable.short} as stable "
            f"(generation {route.generation}, written by {route.created_by})")


def follow_in_ledger(tracking_uri: str, model: str, route: RouteSnapshot) -> str:
    """:func:`follow_route` on the ledger at ``tracking_uri``, after a rollback is committed: a line saying what
    it did, or why it could not (the rollback stands either way: the registry is the auditor's view)."""
    try:
        from revgate.registry.ledger import EvidenceLedger

        with brief_registry_requests():
            return follow_route(EvidenceLedger(tracking_uri, Path.cwd()), model, route).line()
    except Exception as error:
        return (f"registry: not updated ({type(error).__name__}: {error}); `revgate evidence` names the gap "
                "until a later rollout or rollback brings the alias to the route")


def stable_changes(newest_first: Iterable[RouteSnapshot]) -> list[RouteSnapshot]:
    """The generations that changed the stable revision (the first one included), oldest first."""
    history = list(newest_first)[::-1]
    return [snap for before, snap in zip([None, *history], history, strict=False)
            if before is None or before.stable.fingerprint != snap.stable.fingerprint]


def side_by_side(model: str, changes: list[RouteSnapshot], moves: list[dict[str, Any]],
                 versions: dict[str, str]) -> str:
    """The route's stable changes and the ``stable`` alias's moves, one table, by route generation.

    ``versions``: version -> the fingerprint it was registered for.
    """
    rows = [f"route {changes[-1].route} stable changes beside {model}'s alias stable:" if changes else
            f"{model}'s alias stable (the route has no history):",
            f"  {'generation':>10}  {'route stable':<14}{'written by':<34}alias stable"]
    by_generation = {int(m.get("route_generation", 0)): m for m in moves if m.get("alias") == "stable"}
    for snap in changes:
        move = by_generation.pop(snap.generation, None)
        alias = "-" if move is None else _alias_cell(move, versions)
        rows.append(f"  {snap.generation:>10}  {snap.stable.short:<14}{snap.created_by[:32]:<34}{alias}")
    for generation, move in sorted(by_generation.items()):
        rows.append(f"  {generation:>10}  {'':<14}{'':<34}{_alias_cell(move, versions)} (no stable change there)")
    return "\n".join(rows)


def _alias_cell(move: dict[str, Any], versions: dict[str, str]) -> str:
    version = str(move.get("version"))
    fingerprint = versions.get(version, "")
    return f"version {version} ({fingerprint.removeprefix('sha256:')[:12] or '?'}), moved by {move.get('by')}"


@contextlib.contextmanager
def brief_registry_requests() -> Iterator[None]:
    """MLflow's client retries an unreachable server for minutes by default; after a rollback that is
    committed the operator is told at once instead (one try, 5 s), and the environment is put back."""
    wanted = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    before = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
