"""The heartbeat's watch over the candidate's replicas: a failed replica stops the rollout at once; an agent
that cannot be asked is no verdict while another confirms its replica ready, and stops the rollout once no
replica has been confirmed ready for the silence limit."""

from __future__ import annotations

from revgate.flows.steps import CandidateWatch, ReplicaKey
from revgate.serving.worker.views import ReplicaView

GPU1, GPU2 = ("http://198.18.0.5:9100", "r-1"), ("http://198.18.0.6:9100", "r-1")


class Fleet:
    """What each agent answers for its replica: a state, or an unreachable host (``None``)."""

    def __init__(self) -> None:
        self.states: dict[ReplicaKey, str | None] = {GPU1: "ready", GPU2: "ready"}
        self.now = 1000.0

    def ask(self, key: ReplicaKey) -> ReplicaView:
        state = self.states[key]
        if state is None:
            raise ConnectionRefusedError(f"{key[0]} refused the connection")
        failure = {"error": "EngineExited", "message": "engine exited with -9"} if state == "failed" else None
        return ReplicaView.model_validate({"replica_id": key[1], "revision": "sha256:" + "a" * 64,
                                           "served_model": "m", "state": state, "failure": failure,
                                           "worker_url": key[0]})


def watch(fleet: Fleet, silence_s: float = 20.0) -> CandidateWatch:
    return CandidateWatch([GPU1, GPU2], silence_s, fleet.ask, clock=lambda: fleet.now)


def test_a_failed_replica_stops_the_rollout_at_once_naming_it_and_its_agent() -> None:
    fleet = Fleet()
    look = watch(fleet)
    assert look() is None
    fleet.states[GPU2] = "failed"
    fault = look()
    assert fault == "candidate replica r-1 on http://198.18.0.6:9100 is failed: engine exited with -9"


def test_one_silent_host_is_no_verdict_while_another_confirms_its_replica_ready() -> None:
    fleet = Fleet()
    look = watch(fleet)
    fleet.states[GPU2] = None  # the host is down: its agent refuses connections
    for _ in range(10):
        fleet.now += 30  # far past the silence limit: gpu-1 confirms its replica every look
        assert look() is None


def test_no_replica_confirmed_for_the_silence_limit_stops_the_rollout_naming_the_silent_agents() -> None:
    fleet = Fleet()
    look = watch(fleet, silence_s=20)
    assert look() is None
    fleet.states[GPU1] = fleet.states[GPU2] = None  # both hosts cut off
    fleet.now += 19
    assert look() is None  # not yet: within the limit since the last confirmation
    fleet.now += 2
    fault = look()
    assert fault is not None and fault.startswith("no candidate replica confirmed ready for 21 s (limit 20 s)")
    assert fault.endswith("http://198.18.0.5:9100, http://198.18.0.6:9100 did not answer")


def test_a_host_that_answers_again_within_the_limit_resets_the_count() -> None:
    fleet = Fleet()
    look = watch(fleet, silence_s=20)
    fleet.states[GPU1] = fleet.states[GPU2] = None
    fleet.now += 15
    assert look() is None
    fleet.states[GPU1] = "ready"
    fleet.now += 1
    assert look() is None  # confirmed again
    fleet.states[GPU1] = None
    fleet.now += 15
    assert look() is None  # 15 s since the last confirmation, not 31
