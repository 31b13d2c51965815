"""The status view as plain functions: stage, problems, exit code and text over frozen types."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from revgate.cli.status import (
    EXIT_DEGRADED,
    EXIT_ROLLOUT,
    EXIT_STABLE,
    ReplicaState,
    RouterState,
    RouteStatus,
    RunLinks,
    Target,
    WorkerState,
    exit_code,
    problems,
    read_links,
    render,
    router_state,
    status_json,
)
from revgate.serving.router.admin_client import RouterHealth

STABLE, CANDIDATE = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def view(*, candidate: bool, replica_state: str = "ready", router_generation: int = 3) -> RouteStatus:
    replicas = (ReplicaState("r-1", STABLE, "ready", "http://w1:9001"),
                ReplicaState("r-2", CANDIDATE, replica_state, "http://w1:9002/"))
    return RouteStatus(
        route="chat", generation=3, stage="canary" if candidate else "stable",
        stable=Target(STABLE, 900_000 if candidate else 1_000_000, ("http://w1:9001",)),
        candidate=Target(CANDIDATE, 100_000, ("http://w1:9002",)) if candidate else None, shadow=None,
        routers=(router_state("http://r1:8081", RouterHealth(status="ok", route="r", generation=router_generation),
                              3),),
        workers=(WorkerState("http://w1:9000", True, replicas if candidate else replicas[:1]),),
        links=RunLinks(mlflow="unreachable", prefect="not configured"),
    )


def test_exit_codes_follow_stage_and_health() -> None:
    assert exit_code(view(candidate=False)) == EXIT_STABLE
    assert exit_code(view(candidate=True)) == EXIT_ROLLOUT
    loading = view(candidate=True, replica_state="loading")
    assert exit_code(loading) == EXIT_DEGRADED
    assert problems(loading) == ["replica r-2 on http://w1:9000 is loading but routed"]
    assert exit_code(view(candidate=False, router_generation=2)) == EXIT_DEGRADED


def test_an_unrouted_replica_that_is_not_ready_degrades_nothing() -> None:
    status = view(candidate=False)
    spare = WorkerState("http://w1:9000", True, (*status.workers[0].replicas,
                                                   ReplicaState("r-9", CANDIDATE, "loading", "http://w1:9009")))
    assert exit_code(replace(status, workers=(spare,))) == EXIT_STABLE


def test_the_json_document_carries_schema_problems_and_exit_code() -> None:
    document = status_json(view(candidate=True, replica_state="failed"))
    assert (document["schema"], document["exit_code"], document["stage"]) == ("revgate/status/v1", 2, "canary")
    assert document["candidate"] == {"fingerprint": CANDIDATE, "ppm": 100_000, "endpoints": ("http://w1:9002",)}
    assert document["problems"] == ["replica r-2 on http://w1:9000 is failed but routed"]


def test_the_text_names_shares_routers_replicas_and_unreachable_evidence() -> None:
    text = render(view(candidate=True, replica_state="loading")).splitlines()
    assert text[0] == "route chat  generation 3  stage canary"
    assert text[1] == f"  stable    {STABLE[:19]}        90%  http://w1:9001"
    assert text[2] == f"  candidate {CANDIDATE[:19]}        10%  http://w1:9002"
    assert "  http://r1:8081  generation 3  ok" in text
    assert f"    r-2  {CANDIDATE[:19]}  loading    http://w1:9002/" in text
    assert "mlflow run  unreachable" in text and "gates       unreachable" in text
    assert text[-1] == "DEGRADED: replica r-2 on http://w1:9000 is loading but routed"


def test_a_router_behind_the_store_or_silent_is_named() -> None:
    assert router_state("u", RouterHealth(generation=2, status="ok", route="r"), 3) == RouterState(
        "u", "behind", 2, "serves generation 2, the store holds 3")
    assert router_state("u", None, 3, "refused") == RouterState("u", "unreachable", None, "refused")


def test_reading_a_status_never_creates_the_tracking_store(tmp_path: Path) -> None:
    store = tmp_path / "mlflow.db"
    links = read_links("chat", f"sqlite:///{store}", "", "", 1.0)
    assert links.mlflow == "none" and not store.exists()


def test_a_window_past_its_end_and_still_open_says_its_controller_is_gone() -> None:
    from datetime import UTC, datetime

    from revgate.cli.status import window_line

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert window_line("open until 2026-12-01T12:30:00+00:00", now) == "open until 2026-12-01T12:30:00+00:00"
    assert window_line("open until 2026-12-01T11:30:00+00:00", now).endswith(
        "past, and no controller closed it (it died inside the window)")
    assert window_line("ended healthy: 40 requests", now) == "ended healthy: 40 requests"
