"""Slices of live traffic from request features, with unmatched traffic counted."""

from __future__ import annotations

import pytest

from revgate.evaluation.records import RequestRecord
from revgate.evaluation.slicing import RequestFeatures, census, features_of, prompt_length, record_slice, slice_of
from revgate.manifests.gates import Slicing

SLICING = Slicing.build(
    rules=[
        {"slice": "acme-extract", "tenant": "acme", "task": "extract"},
        {"slice": "extract", "task": "extract"},
        {"slice": "batch-long", "request_class": "batch", "prompt_length": "long"},
        {"slice": "chat", "route": "chat"},
    ],
    short_below=100,
    long_from=1000,
)


def request(tenant: str = "", route: str = "", tokens: int | None = 10, **labels: str) -> RequestRecord:
    return RequestRecord(
        "r", "rev", "stable", 0.0, "ok", route=route, tenant=tenant, slices=labels, prompt_tokens=tokens
    )


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (request(tenant="acme", task="extract"), "acme-extract"),  # the first matching rule wins
        (request(tenant="other", task="extract"), "extract"),
        (request(tokens=5000, **{"class": "batch"}), "batch-long"),
        (request(tokens=500, **{"class": "batch"}), "unmatched"),  # medium, not long
        (request(tokens=None, **{"class": "batch"}), "unmatched"),  # unknown length never matches a set one
        (request(route="chat", task="summarise"), "chat"),
        (request(route="api", task="summarise"), "unmatched"),
    ],
)
def test_features_map_to_the_first_matching_rule(record: RequestRecord, expected: str) -> None:
    assert record_slice(record, SLICING) == expected


def test_prompt_length_buckets_follow_the_policy_bounds() -> None:
    assert [prompt_length(t, SLICING) for t in (None, 0, 99, 100, 999, 1000)] == [
        None,
        "short",
        "short",
        "medium",
        "medium",
        "long",
    ]


def test_class_and_task_are_read_from_the_declared_labels_under_the_policy_keys() -> None:
    custom = Slicing.build(rules=[{"slice": "x", "task": "qa"}], task_key="job", class_key="tier")
    features = features_of(request(job="qa", tier="gold"), custom)
    assert features == RequestFeatures(route="", tenant="", request_class="gold", task="qa", prompt_tokens=10)
    assert slice_of(features, custom) == "x"
    assert record_slice(request(task="qa"), custom) == "unmatched"


def test_unmatched_traffic_is_counted_by_its_features_not_dropped() -> None:
    records = [request(tenant="acme", task="extract")] * 3 + [request(tenant="zeta", route="api", task="poem")] * 2
    found = census([*records, request(tokens=None)], SLICING)
    assert found.counts == {"acme-extract": 3, "unmatched": 3}
    assert found.unmatched_requests == 3
    assert found.unmatched == {
        "route=api,tenant=zeta,class=?,task=poem,length=short": 2,
        "route=?,tenant=?,class=?,task=?,length=?": 1,
    }


def test_the_two_sample_quality_gate_slices_live_canary_traffic_by_the_rules() -> None:
    from revgate.evaluation.gates import Evidence, QualityGate
    from revgate.manifests.gates import GatePolicy

    policy = GatePolicy.build(
        min_samples_per_slice=10,
        max_samples_per_stage=100,
        look_every=50,
        slicing={"rules": [{"slice": "extract", "task": "extract"}]},
    )

    def arm(name: str) -> tuple[RequestRecord, ...]:
        tasks = ("extract", "poem")
        return tuple(
            RequestRecord(
                f"{name}{i}",
                name,
                "stable" if name == "s" else "candidate",
                i * 0.1,
                "ok",
                tenant="acme",
                slices={"task": tasks[i % 2]},
                prompt_tokens=50,
            )
            for i in range(40)
        )

    stable, candidate = arm("s"), arm("c")
    scores = {r.request_id: 1.0 for r in (*stable, *candidate)}
    result = QualityGate(policy).evaluate(Evidence(stable, candidate, scores, scores))
    assert [s.slice for s in result.slices] == ["extract", "unmatched"]
    assert result.numbers["unmatched_requests"] == "40"  # 20 per arm: both arms of a canary are counted
    assert result.numbers["unmatched_features"] == "route=?,tenant=acme,class=?,task=poem,length=short x40"
