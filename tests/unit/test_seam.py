"""The one HTTP seam: replies parsed into strict documents at arrival, errors naming the service, the call
and the field; the worker and router-admin clients on it, answered in process by an in-memory transport."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from revgate.manifests.seam import Answer, Exchange, MemoryTransport, Refused, ReplyInvalid, Seam
from revgate.serving.router.admin_client import RouterAdmin
from revgate.serving.worker.client import WorkerClient, WorkerRequestFailed, WorkerUnauthorized
from revgate.serving.worker.report import capacity_report, replica_view
from revgate.serving.worker.state import Capacity, Failure, Replica, ReplicaState
from revgate.serving.worker.views import CapacityReport, ReplicaView

REVISION = "sha256:" + "b" * 64
AGENT = "http://198.18.0.5:9100"


def agent_view(state: str = "ready", **changes: Any) -> dict[str, Any]:
    """A replica view as the agent writes it (serving.worker.report), as JSON would carry it."""
    replica = Replica("r-1", REVISION, "m", state=ReplicaState(state), endpoint="http://198.18.0.5:9201",
                      cpu_cores=(1,), capacity=Capacity(4.0, 40.0, 4),
                      failure=Failure("EngineExited", "engine exited with -9", -9, ("killed",))
                      if state == "failed" else None)
    view: dict[str, Any] = json.loads(json.dumps(replica_view(replica, in_flight=2)))
    return {**view, **changes}


def test_what_the_agent_writes_is_what_the_controller_reads() -> None:
    # The producer's own output parses strictly: a field renamed on one side fails this test, not a rollout.
    view = ReplicaView.model_validate_json(json.dumps(agent_view("failed")))
    assert (view.state, view.in_flight, view.cpu_cores, view.live) == ("failed", 2, (1,), False)
    assert view.failure is not None and view.reason == "EngineExited engine exited with -9"
    replicas = [Replica("r-1", REVISION, "m", state=ReplicaState.READY, endpoint="http://e:1",
                        capacity=Capacity(4.0, 40.0, 4)),
                Replica("r-2", REVISION, "m", state=ReplicaState.WARMING)]
    report = CapacityReport.model_validate_json(json.dumps(capacity_report(replicas, slots=3)))
    assert report.revisions[REVISION].ready_replicas == 1 and report.free_slots == 1
    assert report.revisions[REVISION].ready_endpoints == {"http://e:1": 4.0}


def worker(handlers: dict[tuple[str, str], Any]) -> tuple[WorkerClient, MemoryTransport]:
    transport = MemoryTransport(handlers)
    return WorkerClient(AGENT + "/", "s3cret", transport=transport), transport


def test_the_worker_client_reads_typed_views_carrying_the_agent_they_came_from() -> None:
    client, transport = worker({
        ("GET", "/v1/replicas/r-1"): lambda exchange: (200, agent_view()),
        ("GET", "/v1/replicas"): lambda exchange: (200, {"replicas": [agent_view(), agent_view("draining")]}),
    })
    view = client.replica("r-1")
    assert (view.replica_id, view.state, view.endpoint, view.worker_url) == (
        "r-1", "ready", "http://198.18.0.5:9201", AGENT)
    assert [v.state for v in client.replicas()] == ["ready", "draining"]
    assert transport.exchanges[0].headers["Authorization"] == "Bearer s3cret"
    assert transport.exchanges[0].url == AGENT + "/v1/replicas/r-1"


def test_a_field_of_the_wrong_type_fails_at_the_seam_naming_the_agent_the_call_and_the_field() -> None:
    client, _ = worker({("GET", "/v1/replicas/r-1"): lambda exchange: (200, agent_view(in_flight="many")),
                        ("GET", "/v1/capacity"): lambda exchange: (200, {"revisions": {REVISION: {}}})})
    with pytest.raises(ReplyInvalid) as caught:
        client.replica("r-1")
    assert "in_flight" in caught.value.what and "worker agent" in caught.value.what
    assert caught.value.where == f"GET {AGENT}/v1/replicas/r-1"
    with pytest.raises(ReplyInvalid, match=rf"revisions\.{REVISION}\.ready_replicas: Field required"):
        client.capacity()
    with pytest.raises(ValidationError, match="state"):  # a state the lifecycle does not have
        ReplicaView.model_validate({**agent_view(), "state": "half-ready"})


def test_error_statuses_are_the_workers_own_errors_with_its_reason() -> None:
    client, _ = worker({("GET", "/v1/replicas/r-9"): lambda exchange: (404, {"error": {
        "message": "no replica r-9", "type": "not_found", "fix": "List the replicas."}})})
    with pytest.raises(WorkerRequestFailed) as caught:
        client.replica("r-9")
    assert caught.value.status == 404 and caught.value.fix == "List the replicas."
    assert str(caught.value).startswith("worker agent answered 404: not_found: no replica r-9")
    denied, _ = worker({("GET", "/v1/replicas"): lambda exchange: (401, b"unauthorized")})
    with pytest.raises(WorkerUnauthorized, match="unauthorized"):
        denied.replicas()


def test_an_unreachable_service_is_an_os_error_as_before() -> None:
    def refuse(exchange: Exchange, timeout_s: float) -> Answer:
        raise ConnectionRefusedError(f"{exchange.url} refused")

    with pytest.raises(OSError, match="refused"):
        Seam("http://198.18.0.9:1", service="router", transport=refuse).call("GET", "/x", dict)


def test_the_router_admin_client_reads_health_and_notify_answers() -> None:
    transport = MemoryTransport({
        ("GET", "/admin/health"): lambda exchange: (200, {"status": "degraded", "route": "chat", "generation": 7,
                                                          "router_id": "edge-1", "files": {},
                                                          "sinks": {"requests": {"ok": False, "where": "s3://r/",
                                                                                 "failures": 3, "held": 40,
                                                                                 "signed": True}},
                                                          "store_regressed": {"message": "store went back"}}),
        ("POST", "/admin/notify"): lambda exchange: (200, {"result": "swapped", "generation": 8}),
    })
    admin = RouterAdmin("http://198.18.0.7:8081", "t0ken", transport=transport)
    health = admin.health()
    assert (health.generation, health.status, health.store_regressed) == (7, "degraded", {"message": "store went back"})
    sink = health.sinks["requests"]
    assert (sink.ok, sink.failures, sink.held, sink.signed, sink.written_objects) == (False, 3, 40, True, 0)
    assert (admin.notify().result, transport.exchanges[-1].method) == ("swapped", "POST")
    broken = RouterAdmin("http://r", "t", transport=MemoryTransport({
        ("GET", "/admin/health"): lambda exchange: (200, {"status": "ok", "route": "chat"})}))
    with pytest.raises(ReplyInvalid, match="generation: Field required"):
        broken.health()
    with pytest.raises(Refused) as caught:  # a path the router does not know: 404, the seam's own error
        broken.notify()
    assert caught.value.status == 404
