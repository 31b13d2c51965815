"""The model registry follows the route, on a real SQLite MLflow store and a real route store, through
``revgate rollback`` and ``revgate evidence`` as an operator and an auditor run them.

The defect: a model version was registered only on promotion, its description hard-coded to
"promoted"; after a rollback the ``stable`` alias and the page still said promoted, and a candidate
that was rolled back had no version at all.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import canary, successor
from revgate.registry.follow import ROUTE_STATUS, follow_route
from revgate.registry.ledger import EvidenceLedger, sqlite_uri
from revgate.registry.route_store import open_route_store
from tests.integration.commands import revgate
from tests.integration.test_rollback_cli import healthy_endpoint

pytestmark = pytest.mark.servers

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
OLD = "sha256:" + "1" * 64
NEW = "sha256:" + "2" * 64


def promoted_by_a_flow(ledger: EvidenceLedger, store_url: str, old: tuple[str, ...], new: tuple[str, ...]) -> str:
    """Generation 1 the old stable (set up outside revgate), 2 a canary of the new revision, 3 it promoted;
    the registry written as the promotion flow writes it. The new revision's version."""
    store = open_route_store(store_url)
    first = RouteSnapshot.build(route="chat", generation=1, stable=RevisionTarget(fingerprint=OLD, endpoints=old),
                                created_by="seed", created_at=NOW)
    candidate = RevisionTarget(fingerprint=NEW, endpoints=new)
    with_canary = successor(first, by="flow", now=NOW, candidate=canary(candidate, 50_000, NOW, 600))
    promoted = successor(with_canary, by="flow", now=NOW, stable=candidate, candidate=None)
    run = ledger.open_run("chat", NEW)
    version = ledger.register_version(run, "chat", NEW)
    for snapshot in (first, with_canary, promoted):
        store.write(snapshot)
    follow_route(ledger, "chat", promoted)
    ledger.close(run, "promoted")
    return version


def test_a_rollback_moves_the_stable_alias_and_both_version_pages_say_where_they_stand(tmp_path: Path) -> None:
    tracking = sqlite_uri(tmp_path / "mlflow.db")
    ledger = EvidenceLedger(tracking, tmp_path / "artifacts")
    routes = str(tmp_path / "routes")
    with healthy_endpoint() as old_replica, healthy_endpoint() as new_replica:
        new = promoted_by_a_flow(ledger, routes, (old_replica,), (new_replica,))
        assert ledger.alias_fingerprint("chat", "stable") == NEW

        done = revgate("rollback", "--routes", routes, "--route", "chat", "--created-by", "oncall",
                       "--tracking-uri", tracking)
        assert done.returncode == 0, done.stderr
        assert "alias stable moved from version" in done.stdout, done.stdout

        # The route is the truth and the registry now says the same.
        assert open_route_store(routes).read("chat").stable.fingerprint == OLD  # type: ignore[union-attr]
        assert ledger.alias_fingerprint("chat", "stable") == OLD
        old = ledger.alias_target("chat", "stable")
        assert old is not None and old != new
        left = ledger.client.get_model_version("chat", new)
        assert left.description.startswith(f"{ROUTE_STATUS} no longer stable: replaced by {OLD[7:19]} at route "
                                            "generation 4 (written by oncall)")
        assert left.tags["revgate.decision"] == "rolled_back"
        back = ledger.client.get_model_version("chat", old)
        assert back.description.startswith(f"{ROUTE_STATUS} stable at route generation 4 (written by oncall)")
        assert [(m["alias"], m["version"], m["route_generation"]) for m in ledger.alias_history("chat")] == [
            ("stable", new, 3), ("stable", old, 4)]

        audit = revgate("evidence", NEW, "--tracking-uri", tracking, "--routes", routes)
        print(audit.stdout)
        assert audit.returncode == 0, audit.stdout + audit.stderr
        table = audit.stdout[audit.stdout.index("route chat stable changes"):]
        assert [line.split()[0] for line in table.splitlines()[2:]] == ["1", "3", "4"]
        assert f"version {old} ({OLD[7:19]}), moved by oncall" in table


def test_a_rollback_with_the_registry_unreachable_stands_and_evidence_names_the_gap(tmp_path: Path) -> None:
    tracking = sqlite_uri(tmp_path / "mlflow.db")
    ledger = EvidenceLedger(tracking, tmp_path / "artifacts")
    routes = str(tmp_path / "routes")
    with healthy_endpoint() as old_replica, healthy_endpoint() as new_replica:
        promoted_by_a_flow(ledger, routes, (old_replica,), (new_replica,))
        done = revgate("rollback", "--routes", routes, "--route", "chat", "--created-by", "oncall",
                       "--tracking-uri", "http://127.0.0.1:9")  # nothing listens there
        assert done.returncode == 0, done.stderr
        assert "registry: not updated" in done.stdout and "`revgate evidence` names the gap" in done.stdout
        assert open_route_store(routes).read("chat").stable.fingerprint == OLD  # type: ignore[union-attr]

        audit = revgate("evidence", NEW, "--tracking-uri", tracking, "--routes", routes)
        assert audit.returncode == 5, audit.stdout + audit.stderr
        assert ("chat's alias stable names revision " + NEW[:19]) in audit.stdout
        assert f"route chat serves {OLD[7:19]} as stable (generation 4, written by oncall)" in audit.stdout

        # The next rollback that reaches the registry (here: back to the new revision) brings it to the route.
        again = revgate("rollback", "--routes", routes, "--route", "chat", "--created-by", "oncall",
                        "--tracking-uri", tracking)
        assert again.returncode == 0, again.stderr
    current = open_route_store(routes).read("chat")
    assert current is not None and ledger.alias_fingerprint("chat", "stable") == current.stable.fingerprint
    assert revgate("evidence", NEW, "--tracking-uri", tracking, "--routes", routes).returncode == 0
