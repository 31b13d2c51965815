"""Dead replicas and a store that goes back, through a real router and real upstream servers.

A candidate replica that dies (its server stopped: connections refused) costs no request: the
router ejects it at the first refused connection and sends what the candidate would have served
to its other replicas, or to stable when it has none left, counted as fallbacks.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from revgate.evaluation.records import RequestRecord
from revgate.flows.steps import served_generations
from revgate.registry.route_store import FileRouteStore
from tests.integration.router_harness import UpstreamFarm, fingerprint, router_process, snapshot, wait_until
from tests.integration.test_flow_lock import spec as lock_spec

pytestmark = pytest.mark.servers

ROUTE = "chat"


def counter(admin_url: str, name: str) -> int:
    for line in httpx.get(f"{admin_url}/metrics").text.splitlines():
        if line.startswith(f"revgate_router_{name}"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def send(url: str, sessions: range) -> list[tuple[int, str]]:
    """One request per session: its status and the revision that answered."""
    answers = []
    with httpx.Client(timeout=20) as client:
        for session in sessions:
            response = client.post(f"{url}/v1/completions", json={"model": ROUTE, "prompt": "hi", "max_tokens": 2},
                                   headers={"x-session-id": f"session-{session}"})
            answers.append((response.status_code, response.headers.get("x-revgate-revision", "")))
    return answers


def test_a_candidate_replica_that_dies_costs_no_request(tmp_path: Path) -> None:
    with UpstreamFarm(["s1"]) as stable, UpstreamFarm(["c1"]) as first, UpstreamFarm(["c2"]) as second:
        route = snapshot(ROUTE, 1, [stable["s1"]], candidate=[first["c1"], second["c2"]], weight_ppm=500_000)
        with router_process(tmp_path, ROUTE, route) as router:
            before = send(router.url, range(40))
            assert all(status == 200 for status, _ in before)
            assert {revision for _, revision in before} == {fingerprint("s"), fingerprint("c")}

            first.__exit__()  # one candidate replica dies: its port refuses connections
            wait_until(lambda: not accepts(first["c1"].port), timeout=20)
            one_dead = send(router.url, range(40, 120))
            assert [a for a in one_dead if a[0] != 200] == [], "a request failed on a dead candidate replica"
            assert fingerprint("c") in {revision for _, revision in one_dead}  # the other replica serves on
            assert counter(router.admin_url, "endpoint_ejected_total") >= 1

            second.__exit__()  # the candidate's last replica dies: its requests go to stable
            wait_until(lambda: not accepts(second["c2"].port), timeout=20)
            fallbacks = counter(router.admin_url, "fallback_to_stable_total")
            none_left = send(router.url, range(120, 200))
            assert [a for a in none_left if a[0] != 200] == [], "a request failed with no candidate replica left"
            assert {revision for _, revision in none_left} == {fingerprint("s")}
            assert counter(router.admin_url, "fallback_to_stable_total") > fallbacks
            # Each fallback is in the records too, naming the candidate it fell back from: the gates count it
            # as the candidate's failure (flows.evidence), not as one more request stable served.
            total = counter(router.admin_url, "fallback_to_stable_total")

            def fell_back() -> list[RequestRecord]:
                lines = router.records.read_text().splitlines() if router.records.exists() else []
                return [r for r in map(RequestRecord.from_json, lines) if r.fallback_from]

            wait_until(lambda: len(fell_back()) == total, timeout=20, describe=lambda: f"{len(fell_back())} of {total}")
            assert {(r.revision, r.fallback_from, r.outcome) for r in fell_back()} == {
                (fingerprint("s"), fingerprint("c"), "ok")}


def test_a_dead_replicas_probes_cost_no_request_even_with_no_retries(tmp_path: Path) -> None:
    # The defect: each probe of an ejected replica was a user's request, and with no retries it failed:
    # one failed request per router at 1, 3, 7, 15 s after the death, then every 30 s, for as long as the
    # dead replica stayed in the route. A refused connection sends nothing, so it spends no retry now.
    with UpstreamFarm(["s1"]) as stable, UpstreamFarm(["c1"]) as first, UpstreamFarm(["c2"]) as second:
        route = snapshot(ROUTE, 1, [stable["s1"]], candidate=[first["c1"], second["c2"]], weight_ppm=500_000,
                         max_retries=0)
        with router_process(tmp_path, ROUTE, route) as router:
            first.__exit__()
            wait_until(lambda: not accepts(first["c1"].port), timeout=20)
            answers: list[tuple[int, str]] = []

            def probed_again() -> bool:  # the dead replica ejected, its backoff passed, and probed again
                answers.extend(send(router.url, range(len(answers), len(answers) + 20)))
                return counter(router.admin_url, "endpoint_ejected_total") >= 3

            wait_until(probed_again, timeout=60)
            assert [a for a in answers if a[0] != 200] == [], "a probe of the dead replica failed a request"
            assert fingerprint("c") in {revision for _, revision in answers}  # the live replica serves on


def accepts(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_an_ejected_replica_is_probed_again_and_serves_once_it_is_back(tmp_path: Path) -> None:
    with UpstreamFarm(["s1"]) as stable:
        dead = UpstreamFarm(["c1"])  # not started yet: its port refuses
        route = snapshot(ROUTE, 1, [stable["s1"]], candidate=[dead["c1"]], weight_ppm=1_000_000)
        with router_process(tmp_path, ROUTE, route) as router:
            assert {revision for status, revision in send(router.url, range(5)) if status == 200} == {fingerprint("s")}
            with dead:  # the replica comes up: after its backoff the router probes it and it serves
                deadline = time.monotonic() + 30
                served: set[str] = set()
                while fingerprint("c") not in served and time.monotonic() < deadline:
                    answers = send(router.url, range(5, 10))
                    assert all(status == 200 for status, _ in answers)
                    served |= {revision for _, revision in answers}
                assert fingerprint("c") in served, "the candidate replica was never probed again"


def test_a_store_whose_generation_goes_back_is_a_new_epoch_the_router_names_until_an_operator_accepts_it(
    tmp_path: Path,
) -> None:
    # The defect: a store restored from a backup (or recreated) held an older generation; every
    # router kept its newer snapshot for ever, silently, and the flow counted it as serving.
    with (
        UpstreamFarm(["old1"]) as old,
        UpstreamFarm(["new1"]) as new,
        router_process(tmp_path, ROUTE, snapshot(ROUTE, 1, [old["old1"]])) as router,
    ):
        for _ in (2, 3):
            router.commit(lambda g: snapshot(ROUTE, g, [old["old1"]]))
        admin = {"Authorization": f"Bearer {router.token}"}
        assert httpx.get(f"{router.admin_url}/admin/health", headers=admin).json()["generation"] == 3

        shutil.rmtree(tmp_path / "routes")  # the store is recreated: generation 1 again, another stable
        FileRouteStore(tmp_path / "routes").write(snapshot(ROUTE, 1, [new["new1"]]))
        assert router.notify()["result"] == "older"
        health = httpx.get(f"{router.admin_url}/admin/health", headers=admin).json()
        assert health["status"] == "degraded" and health["generation"] == 3
        assert health["store_regressed"]["store_generation"] == 1
        assert "went back from generation 3 to 1" in health["store_regressed"]["message"]
        assert {revision for _, revision in send(router.url, range(3))} == {fingerprint("old")}  # serves on
        assert "a new store epoch" in (tmp_path / "router.log").read_text()
        # The flow no longer counts it as serving the route it wrote.
        spec = lock_spec(tmp_path, ROUTE).model_copy(update={
            "router_admin_url": router.admin_url, "router_admin_token_file": str(tmp_path / "token")})
        assert served_generations(spec) == {router.admin_url: None}

        accepted = httpx.post(f"{router.admin_url}/admin/accept-store-epoch", headers=admin).json()
        assert accepted == {"result": "installed", "generation": 1}
        health = httpx.get(f"{router.admin_url}/admin/health", headers=admin).json()
        assert health["status"] == "ok" and health["store_regressed"] is None
        assert {revision for _, revision in send(router.url, range(3))} == {fingerprint("new")}
