"""Who may steer a rollout's evidence: the cohort's secret, credentials for evidence labels, the router's ids."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from revgate.evaluation.records import RequestRecord
from revgate.evaluation.replay import request_headers
from revgate.evaluation.traces import TraceEntry
from revgate.flows.evidence import own_traffic, probe_labels
from revgate.manifests.errors import ManifestInvalid
from revgate.manifests.rollout import RolloutPlan, SetWeight
from revgate.manifests.route import RouteSnapshot
from revgate.promotion.machine import Abort, advance, start
from revgate.promotion.routes import RolloutKeys, desired_route, renew_leases
from revgate.rollback.plan import plan_rollback
from revgate.serving.router.parse import drop_evidence_metadata, parse_body, rewrite_model
from revgate.serving.router.split import bucket_ppm, compile_route

STABLE, CANDIDATE = "sha256:" + "a" * 64, "sha256:" + "b" * 64
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
PROBE = "the-rollouts-probe-credential-0001"


def digest(credential: str) -> str:
    return "sha256:" + hashlib.sha256(credential.encode()).hexdigest()


def canary_route(weight_ppm: int = 100_000, **extra: Any) -> RouteSnapshot:
    return RouteSnapshot.build(
        route="chat", generation=2, created_by="t", created_at=NOW.isoformat(),
        stable={"fingerprint": STABLE, "endpoints": ["http://127.0.0.1:1"]},
        candidate={"fingerprint": CANDIDATE, "endpoints": ["http://127.0.0.1:2"], "weight_ppm": weight_ppm,
                   "lease_expires_at": (NOW + timedelta(hours=1)).isoformat()},
        **extra,
    )


def on_canary(snapshot: RouteSnapshot, keys: list[bytes]) -> list[bytes]:
    pinned = compile_route(snapshot)
    return [key for key in keys if pinned.assign(key, NOW.timestamp()).arm == "candidate"]


def test_a_caller_who_knows_the_route_and_candidate_cannot_pick_the_canary() -> None:
    sessions = [f"s{index}".encode() for index in range(4000)]
    # What a caller could compute before: the route's name and the candidate's fingerprint (both public
    # enough: answers named the revision) were the whole salt.
    chosen = [key for key in sessions if bucket_ppm(f"chat|{CANDIDATE}".encode(), key) < 100_000]
    assert len(chosen) > 300
    secret = "5e" * 32
    landed = on_canary(canary_route(cohort_secret=secret), chosen)
    assert len(landed) < 0.2 * len(chosen), len(landed)  # about 10 %: the chosen ones are like any others
    # Another rollout of the same candidate draws another cohort.
    again = on_canary(canary_route(cohort_secret="7f" * 32), sessions)
    first = on_canary(canary_route(cohort_secret=secret), sessions)
    assert len(set(again) & set(first)) < 0.3 * len(first)


def test_only_the_named_credentials_may_declare_evidence() -> None:
    gateway = "the-gateway-in-front-credential"
    pinned = compile_route(canary_route(probe_credential=digest(PROBE), trusted_sources=(digest(gateway),)))
    assert pinned.trusts(PROBE.encode()) and pinned.trusts(gateway.encode())
    assert not pinned.trusts(b"a-guess") and not pinned.trusts(b"") and not pinned.trusts(None)
    assert not pinned.trusts(digest(PROBE).encode())  # the digest the store holds is no credential
    bare = compile_route(canary_route())
    assert not bare.trusts(PROBE.encode()) and not bare.reveal


@pytest.mark.parametrize(("field", "value", "message"), [
    ("probe_credential", "plain-text-credential", "probe_credential must be sha256"),
    ("trusted_sources", ("sha256:short",), "trusted_sources must be sha256"),
    ("cohort_secret", "not hex", "cohort_secret must be 32 to 128"),
    ("cohort_secret", "ab" * 8, "cohort_secret must be 32 to 128"),
])
def test_a_route_with_a_malformed_secret_or_digest_is_refused(field: str, value: Any, message: str) -> None:
    data = json.loads(canary_route().model_dump_json())
    data[field] = value
    with pytest.raises(ManifestInvalid, match=message):
        RouteSnapshot.from_json(json.dumps(data), source="route.json")


def test_the_rollouts_keys_are_on_the_route_while_it_runs_and_gone_with_its_decision() -> None:
    keys = RolloutKeys.new()
    assert PROBE not in repr(keys) and keys.cohort_secret not in repr(keys) and keys.probe_credential not in repr(keys)
    plan = RolloutPlan(steps=(SetWeight(weight_ppm=100_000),))
    first = RouteSnapshot.build(route="chat", generation=1, created_by="t", created_at=NOW.isoformat(),
                                stable={"fingerprint": STABLE, "endpoints": ["http://127.0.0.1:1"]})
    target = canary_route().candidate
    assert target is not None
    state = start(plan)
    running = desired_route(first, state, target, lease_seconds=60, by="flow", now=NOW, keys=keys)
    assert running is not None and running.candidate is not None
    assert running.cohort_secret == keys.cohort_secret and running.probe_credential == keys.probe_digest
    renewed = renew_leases(running, lease_seconds=60, by="flow", now=NOW + timedelta(seconds=20))
    assert renewed.cohort_secret == keys.cohort_secret  # a renewal keeps the cohort: no session flips arm
    ended = desired_route(renewed, advance(plan, state, Abort("test")), target, lease_seconds=60, by="flow",
                          now=NOW, keys=keys)
    assert ended is not None and ended.candidate is None
    assert ended.cohort_secret == "" and ended.probe_credential == ""
    aborted = plan_rollback(iter([renewed]), by="operator", now=NOW)
    assert aborted.cohort_secret == "" and aborted.probe_credential == ""


def test_evidence_metadata_never_reaches_the_engine() -> None:
    body = b'{"model":"chat","prompt":"hi","metadata":{"revgate_slices":"x","revgate_class":"probe","app":"a"}}'
    document = parse_body(body)
    assert drop_evidence_metadata(document) is True
    written = json.loads(rewrite_model(body, None, document, changed=True))
    assert written == {"model": "chat", "prompt": "hi", "metadata": {"app": "a"}}
    only_ours = parse_body(b'{"prompt":"hi","metadata":{"revgate_task":"sql"}}')
    assert drop_evidence_metadata(only_ours) and "metadata" not in only_ours
    plain = b'{"model":"chat","prompt":"hi"}'
    assert drop_evidence_metadata(parse_body(plain)) is False
    assert rewrite_model(plain, None, parse_body(plain)) is plain  # nothing to change: the same bytes


def test_probe_labels_join_on_the_routers_id_never_the_callers() -> None:
    entries = [TraceEntry(request_id=f"step01-b0-t{index}", offset_s=0.0, body={}, reference="3") for index in range(3)]
    sent = [RequestRecord(request_id=f"step01-b0-t{index}", revision=STABLE, arm="direct", arrival_s=1.0,
                          outcome="ok", router_request_id=f"router-{index}" if index < 2 else "")
            for index in range(3)]
    labels = probe_labels(sent, entries)
    assert set(labels) == {"router-0", "router-1"}  # the third never got the router's answer: no join
    assert labels["router-1"].request_id == "step01-b0-t1"
    assert "x-revgate-credential" not in request_headers(entries[0])
    assert request_headers(entries[0], PROBE)["x-revgate-credential"] == PROBE


def test_demand_excludes_probes_by_their_label_alone() -> None:
    assert own_traffic({"request_id": "r", "slices": {"class": "probe"}})
    assert not own_traffic({"request_id": "r", "caller_request_id": "step01-b0-t1", "slices": {}})
