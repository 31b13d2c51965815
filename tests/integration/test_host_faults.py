"""Faults between hosts, at the route: the candidate's replicas dying one host at a time, and a router cut
from the route store while a canary's lease is held. Every part on a host of its own (network
namespaces), two real routers signing their records into moto's S3 on ``store``, open-loop users
through both; the upstreams are small responders (tests/integration/host_faults.py), since what is
tried is the route, not an engine. bench/faults.py measures the same scenarios, repeated.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from revgate.evaluation.records import FALLBACK_ERROR, own_failure
from revgate.flows.evidence import StageRecords
from revgate.registry.record_store import StageWindow
from tests.integration.host_faults import (
    CANDIDATE,
    STABLE,
    Fleet,
    controller_spec,
    cut_edge_lease,
    faults_fleet,
    last_replica,
)
from tests.integration.hosts import Network
from tests.integration.rollout_estate import wait_until
from tests.integration.test_hosts import ROUTE

pytestmark = pytest.mark.servers
RATE = 10.0  # users' requests per second, both routers together
LEASE_S, RENEW_S = 6, 1.0  # the controller's canary lease and its renewal period


@pytest.fixture(scope="module")
def fleet(hosts: Network) -> Iterator[Fleet]:
    with faults_fleet(hosts, RATE) as built:
        yield built
    assert hosts.leftovers() == {}, "a part of this module still runs on its host"


@pytest.mark.timeout(600)
def test_the_candidates_last_replica_killed_sends_its_share_to_stable_as_failures_of_the_candidate(
    fleet: Fleet,
) -> None:
    run = last_replica(fleet)
    print("last replica:", run)
    # Each kill costs at most what was in flight on the dead replica; new requests are served at once,
    # the candidate's by its other replica, then, with none left, by stable.
    assert run["seconds"] <= 1.0, run
    assert run["sent_after_kill"] >= 20 and run["fallbacks"] > 0, run
    assert run["failed_a_second_after_a_kill"] == 0, run

    # Every fallback is in the record sink, signed by the router that made it, naming the candidate: the
    # stage's evidence counts each as the candidate's failure, not as one more request stable served.
    records = StageRecords(fleet.plane.records, ROUTE, StageWindow(first_generation=run["generation"]),
                           paired=False, signers={edge.name: edge.signer for edge in fleet.edges})

    def all_fallbacks_read() -> bool:
        records.poll()
        return records.canary(STABLE, CANDIDATE, {}).fallbacks >= run["fallbacks"]

    wait_until(all_fallbacks_read, 60, lambda: f"{records.canary(STABLE, CANDIDATE, {}).fallbacks} of "
                                               f"{run['fallbacks']} fallbacks read from the sink")
    arms = records.canary(STABLE, CANDIDATE, {})
    fell_back = [r for r in arms.candidate if r.fallback_from]
    assert len(fell_back) == arms.fallbacks == run["fallbacks"] and not arms.lost, (arms.fallbacks, arms.lost)
    assert all(own_failure(r) and r.error == FALLBACK_ERROR and r.revision == CANDIDATE for r in fell_back)
    assert f"{run['fallbacks']} of the candidate's went to stable" in arms.note()


@pytest.mark.timeout(600)
def test_an_edge_cut_from_the_store_mid_canary_sends_new_requests_to_stable_at_its_lease_end_then_catches_up(
    fleet: Fleet,
) -> None:
    spec = controller_spec(fleet.plane, fleet.edges, fleet.network["control"])
    run = cut_edge_lease(fleet, spec, LEASE_S, RENEW_S)
    print("edge cut under a lease:", run)
    # edge-1 kept the snapshot it held and served from it; once that snapshot's lease ended, by its own clock,
    # no request sent through it went to the candidate, while edge-2 served the renewed canary.
    assert run["edge_1_generation_while_cut"] == run["edge_1_held_generation"], run
    assert run["seconds"] is not None and run["seconds"] <= 0.1, run
    assert run["edge_2_candidate_share_after_lease_end"] > 0, run
    assert run["failed"] == 0 and run["sent"] > 0, run
