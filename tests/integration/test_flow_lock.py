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
from tests.integration.rollout_estate import wait_until

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

    from revgate.flows.promote import promote_revision
    from revgate.flows.route_lock import RolloutInProgress, ensure_route_lock, lock_name

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


def active_slots(name: str) -> int:
    """How many slots of the limit ``name`` the Prefect server counts as taken (asked directly)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name).active_slots


def test_a_slow_prefect_is_waited_for_and_only_a_held_lock_refuses_a_rollout(
    prefect_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The defect: the lock request had 5 s in all; a loaded Prefect server that took longer to answer had
    # a rollout of a free route refused as "already has a rollout in progress".
    import time

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from revgate.flows import route_lock
    from revgate.flows.promote import hold_route_lock
    from revgate.flows.route_lock import PrefectUnanswered, RolloutInProgress, lock_name
    from tests.integration.s3_proxy import slow_to_answer

    root = prefect_api.removesuffix("/api")
    slow_s = 7.0
    seen: list[str] = []  # every request's path, as the proxy takes it in

    def delay(_: str, path: str) -> float:
        seen.append(path)
        return slow_s if path.endswith(LEASE_PATH) else 0.0

    with slow_to_answer(root, delay) as slow, \
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
        monkeypatch.setattr(route_lock, "LOCK_ACQUIRE_S", 2.0)
        given_back = len(seen)  # the requests before this one (the released lock's among them)
        with pytest.raises(PrefectUnanswered) as unanswered:
            hold_route_lock(spec(tmp_path, "unanswered"))
        # Its grant came later, to nobody: given back (asked once the grant was made), so the route is not
        # held for a lease by no one.
        wait_until(lambda: any(path.endswith("/decrement-with-lease") for path in seen[given_back:]), 60,
                   "the late grant given back")
        wait_until(lambda: active_slots(lock_name("unanswered")) == 0, 60, "the route free again")
    message = str(unanswered.value)
    assert "did not answer" in message and "within 2 s" in message and "PREFECT_API_URL" in message


def test_a_route_lock_whose_lease_ended_is_taken_again_and_one_taken_by_another_is_said(
    prefect_api: str, tmp_path: Path
) -> None:
    # The defect: Prefect's own renewal gave up after three failed tries (half a minute of an outage); the
    # slot was then gone for the rest of the rollout and a second rollout of the route could start.
    from prefect.client.orchestration import get_client

    from revgate.flows.route_lock import RolloutInProgress, RouteLock, lock_name, taken_by_another

    said: list[str] = []
    lock = RouteLock("lapsed", 60, say=said.append).take()
    try:
        def end_lease(lease: object) -> None:  # what Prefect does to a lease nobody renewed for its duration
            with get_client(sync_client=True) as client:
                client.release_concurrency_slots_with_lease(lease_id=lease)  # type: ignore[arg-type]

        end_lease(lock.lease_id)
        assert active_slots(lock_name("lapsed")) == 0  # free: a second rollout could start now
        # False is Prefect failing one call (a busy shared server): asked again, as the keeper does.
        wait_until(lock.keep_once, 30, "one renewal Prefect answers")
        assert lock.taken_again == 1 and "taken again" in said[-1], said
        assert active_slots(lock_name("lapsed")) == 1
        with pytest.raises(RolloutInProgress):
            RouteLock("lapsed", 60).take()

        end_lease(lock.lease_id)
        other = RouteLock("lapsed", 60).take()  # another rollout, started while the slot was free
        try:
            assert taken_by_another(lock)() is None  # not known yet: the keeper has not asked
            wait_until(lock.keep_once, 30, "one renewal Prefect answers")
            assert lock.lost and lock.lease_id is None and "another rollout took it" in said[-1], said
            # The heartbeat's watch of the lock: a decision, stop and route back, not a rollout that goes on.
            fault = taken_by_another(lock)()
            assert fault is not None and "another rollout of route 'lapsed' took it" in fault, fault
            assert "stops and routes back to stable" in said[-1], said
            lock.close()  # gives back nothing of the other's
            assert active_slots(lock_name("lapsed")) == 1
        finally:
            other.close()
        assert active_slots(lock_name("lapsed")) == 0
    finally:
        lock.close()


@pytest.mark.timeout(600)
def test_a_route_lock_outlives_a_prefect_restart_and_is_free_once_given_back(tmp_path: Path) -> None:
    # The defect: Prefect's server kept leases in memory; restarted, it forgot them, and the slot they held
    # stayed counted: every later rollout of the route was refused as "already has a rollout in progress".
    from contextlib import ExitStack

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from revgate.flows.processes import free_port, prefect_server
    from revgate.flows.route_lock import RolloutInProgress, RouteLock, lock_name

    home, port, said = tmp_path / "prefect", free_port(), []
    first = ExitStack()
    env = first.enter_context(prefect_server(home, port=port))
    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        lock = RouteLock("restarted", 60, say=said.append).take()
        first.close()
        assert not lock.keep_once() and "cannot renew the route lock" in said[-1], said  # away: said, not raised
        with prefect_server(home, port=port):
            assert lock.keep_once() and said[-1].endswith("is held"), said  # its own lease, renewed
            assert lock.taken_again == 0 and not lock.lost
            with pytest.raises(RolloutInProgress):
                RouteLock("restarted", 60).take()
            lock.close()
            assert active_slots(lock_name("restarted")) == 0
            RouteLock("restarted", 60).take().close()  # a new rollout of the route starts


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
    from revgate.flows.promote import hold_route_lock
    from revgate.flows.route_lock import release_route_lock

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
