"""One rollout per route: a second promotion on a locked route is refused and moves no traffic."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from revgate.flows.spec import PromotionSpec
from revgate.manifests.gates import GatePolicy
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.registry.route_store import open_route_store
from revgate.serving.worker.request import SignaturePolicySpec

pytestmark = pytest.mark.servers


def spec(tmp_path: Path, route: str) -> PromotionSpec:
    unreachable = "http://127.0.0.1:9"  # never contacted: the lock is taken first
    return PromotionSpec(
        route=route, candidate_manifest="sha256:" + "2" * 64, artifact_store=str(tmp_path / "artifacts"),
        route_store=str(tmp_path / "routes"), signature=SignaturePolicySpec(kind="key", public_key="k.pub"),
        gate_policy=GatePolicy(), worker_url=unreachable, worker_token_file="t", router_url=unreachable,
        router_admin_url=unreachable, router_admin_token_file="t", records_sink=str(tmp_path / "records"), trace="t",
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", evidence_root=str(tmp_path / "evidence"),
    )


def test_a_concurrent_rollout_is_refused_and_changes_nothing(prefect_api: str, tmp_path: Path) -> None:
    from prefect.concurrency.sync import concurrency

    from revgate.flows.promote import RolloutInProgress, ensure_route_lock, lock_name, promote_revision

    store = open_route_store(str(tmp_path / "routes"))
    stable = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
    now = datetime.now(UTC)
    store.write(RouteSnapshot(route="locked", generation=1, stable=stable, created_by="t", created_at=now))
    ensure_route_lock("locked")
    with concurrency(lock_name("locked"), occupy=1, strict=True), pytest.raises(RolloutInProgress) as caught:
        promote_revision(spec(tmp_path, "locked"))
    assert "already has a rollout in progress" in str(caught.value)
    assert [snap.generation for snap in store.history("locked")] == [1]
    assert not (tmp_path / "mlflow.db").exists()  # refused before any evidence run was opened


LEASE_PATH = "/concurrency_limits/increment-with-lease"


def test_a_slow_prefect_is_waited_for_and_only_a_held_lock_refuses_a_rollout(
    prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The defect: the lock request had 5 s in all; a loaded Prefect server that took longer to answer had
    # a rollout of a free route refused as "already has a rollout in progress".
    import time

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from revgate.flows import promote
    from revgate.flows.promote import PrefectUnanswered, RolloutInProgress, hold_route_lock
    from tests.integration.s3_proxy import slow_to_answer

    root = prefect_api.removesuffix("/api")
    slow_s = 7.0
    with slow_to_answer(root, lambda _, path: slow_s if path.endswith(LEASE_PATH) else 0.0) as slow, \
            temporary_settings(updates={PREFECT_API_URL: f"{slow}/api"}):
        began = time.monotonic()
        lock = hold_route_lock(spec(tmp_path, "slow"))
        assert time.monotonic() - began >= slow_s  # it waited for Prefect's answer
        try:
            with pytest.raises(RolloutInProgress, match="already has a rollout in progress"):
                hold_route_lock(spec(tmp_path, "slow"))  # held: Prefect's 423, however slow, is a refusal
        finally:
            lock.close()
        hold_route_lock(spec(tmp_path, "slow")).close()  # given back: free again

        # Prefect that does not answer within the limit: said so, not taken for a rollout in progress.
        monkeypatch.setattr(promote, "LOCK_ACQUIRE_S", 2.0)
        with pytest.raises(PrefectUnanswered) as unanswered:
            hold_route_lock(spec(tmp_path, "unanswered"))
    message = str(unanswered.value)
    assert "did not answer" in message and "within 2 s" in message and "PREFECT_API_URL" in message


def server_pids(port: int) -> list[int]:
    """The processes whose command line is a server on ``port`` (the Prefect server and its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and b"--port" in argv and str(port).encode() in argv:
            found.append(int(entry.name))
    return found


@pytest.mark.timeout(600)
def test_a_prefect_that_stops_answering_or_goes_away_never_holds_a_decision_back(tmp_path: Path) -> None:
    # The defect: right after a promotion's commit the flow gave the lock back with Prefect's client, in
    # line; with Prefect down that raised (ConnectError), and the flow left the rollback window unrun.
    import os
    import signal
    import time
    from contextlib import ExitStack

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from revgate.flows.processes import prefect_server
    from revgate.flows.promote import hold_route_lock, release_route_lock

    server = ExitStack()
    env = server.enter_context(prefect_server(tmp_path / "prefect"))
    with server, temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        port = int(env["PREFECT_API_URL"].rsplit(":", 1)[1].split("/")[0])
        pids = server_pids(port)
        assert pids, "the Prefect server's process"
        hung = hold_route_lock(spec(tmp_path, "hung"))
        gone = hold_route_lock(spec(tmp_path, "gone"))
        for pid in pids:  # accepts connections (the kernel's backlog) and answers nothing: a host cut off
            os.kill(pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            why = release_route_lock(hung, limit_s=3)
            assert time.monotonic() - began < 30 and why == "Prefect did not answer within 3 s", why
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        server.close()  # Prefect gone, this process still pointed at it: a refused connection is named, not raised
        why = release_route_lock(gone, limit_s=30)
        assert "Connect" in why, why
        assert release_route_lock(gone, limit_s=3) == ""  # given back once: the second is a no-op
