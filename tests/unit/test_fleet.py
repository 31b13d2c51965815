"""Placing candidate replicas across worker agents, summing their capacity, and routers behind."""

from __future__ import annotations

from revgate.promotion.capacity import RevisionCapacity
from revgate.promotion.fleet import AgentSlots, merge_capacity, place_replicas, replica_count, routers_behind


def test_replicas_spread_over_agents_before_any_agent_gets_a_second() -> None:
    agents = [AgentSlots("http://a", 1), AgentSlots("http://b", 2), AgentSlots("http://c", 0)]
    assert place_replicas(agents, 2) == ["http://b", "http://a"]  # the freest first, then the next
    assert place_replicas(agents, 3) == ["http://b", "http://a", "http://b"]
    # Past every free slot, placement still places (the worker shares its cores); it never refuses.
    assert place_replicas(agents, 5) == ["http://b", "http://a", "http://b", "http://b", "http://a"]
    assert place_replicas([AgentSlots("http://a", 0), AgentSlots("http://b", 0)], 3) == [
        "http://a", "http://b", "http://a"]
    assert place_replicas(agents, 0) == [] and place_replicas([], 2) == []


def test_capacity_adds_up_across_agents() -> None:
    merged = merge_capacity([
        {"sha256:s": RevisionCapacity(1, 10.0)},
        {"sha256:s": RevisionCapacity(2, 15.0), "sha256:c": RevisionCapacity(1, 4.0)},
    ])
    assert merged == {"sha256:s": RevisionCapacity(3, 25.0), "sha256:c": RevisionCapacity(1, 4.0)}


def test_a_router_behind_or_silent_is_named_with_what_it_serves() -> None:
    served = {"http://r1": 7, "http://r2": 6, "http://r3": None, "http://r4": 8}
    assert routers_behind(served, 7) == {"http://r2": 6, "http://r3": None}
    assert routers_behind({"http://r1": 7}, 7) == {}


def test_unless_the_plan_says_a_candidate_gets_two_replicas_where_two_agents_have_room() -> None:
    two = [AgentSlots("http://a", 1), AgentSlots("http://b", 2)]
    assert replica_count(None, two) == 2 and place_replicas(two, replica_count(None, two)) == ["http://b", "http://a"]
    assert replica_count(None, [AgentSlots("http://a", 2), AgentSlots("http://b", 0)]) == 1  # one domain with room
    assert replica_count(None, [AgentSlots("http://a", 4)]) == 1
    assert replica_count(3, [AgentSlots("http://a", 4)]) == 3  # what the plan asks, whatever the fleet
