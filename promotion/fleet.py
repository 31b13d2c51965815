"""The fleet: candidate replicas placed across worker agents, capacity summed across them, and the
routers that must all serve a generation before a step counts as applied. Pure functions.

Each worker agent is its own failure domain (a host): replicas are spread over as many agents as
there are before any agent gets a second one, the agents with the most free capacity first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from revgate.promotion.capacity import RevisionCapacity


@dataclass(frozen=True, slots=True)
class AgentSlots:
    """One worker agent as placement sees it: its URL and how many more replicas it says it can take."""

    url: str
    free_slots: int


def replica_count(asked: int | None, agents: Sequence[AgentSlots]) -> int:
    """How many replicas to start: ``asked``, else two where two agents have a free slot (two failure
    domains: one lost host then costs half the replicas, not all of them), else one."""
    if asked is not None:
        return asked
    return 2 if sum(agent.free_slots > 0 for agent in agents) >= 2 else 1


def place_replicas(agents: Sequence[AgentSlots], count: int) -> list[str]:
    """The agent URL for each of ``count`` replicas: spread over agents, the freest first, round by round.

    An agent that reports no free slot still takes a replica when no agent has one (the worker
    then shares its cores, see serving.worker.cores): placement never refuses, capacity checks do.
    """
    if not agents or count <= 0:
        return []
    order = sorted(range(len(agents)), key=lambda index: (-agents[index].free_slots, index))
    free = {index: agents[index].free_slots for index in order}
    placed: list[str] = []
    while len(placed) < count:
        round_ = [index for index in order if free[index] > 0] or order
        for index in round_:
            if len(placed) == count:
                break
            placed.append(agents[index].url)
            free[index] -= 1
    return placed


def merge_capacity(reports: Sequence[Mapping[str, RevisionCapacity]]) -> dict[str, RevisionCapacity]:
    """Per-revision capacity over every agent: ready replicas and measured throughput add up."""
    merged: dict[str, RevisionCapacity] = {}
    for report in reports:
        for revision, capacity in report.items():
            known = merged.get(revision, RevisionCapacity(0, 0.0))
            merged[revision] = RevisionCapacity(known.ready_replicas + capacity.ready_replicas,
                                                known.requests_per_s + capacity.requests_per_s)
    return merged


def routers_behind(served: Mapping[str, int | None], generation: int) -> dict[str, int | None]:
    """The routers not yet serving ``generation`` (or later), with what they serve (None: not answering)."""
    return {router: seen for router, seen in served.items() if seen is None or seen < generation}
