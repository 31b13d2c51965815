"""Canary split, lease expiry, shadow sampling and the mirroring policy: pure functions."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from revgate.manifests.route import RouteSnapshot
from revgate.serving.router.ejection import Ejections
from revgate.serving.router.split import bucket_ppm, compile_route, retry_order
from revgate.shadow.policy import side_effecting

STABLE = "sha256:" + "a" * 64
CANDIDATE = "sha256:" + "b" * 64
SHADOW = "sha256:" + "c" * 64
NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def route(weight: int, *, lease: timedelta = timedelta(hours=1), **extra: Any) -> RouteSnapshot:
    return RouteSnapshot.build(
        route="chat", generation=3, created_by="t", created_at=NOW.isoformat(),
        stable={"fingerprint": STABLE, "endpoints": ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]},
        candidate={"fingerprint": CANDIDATE, "endpoints": ["http://127.0.0.1:9"], "weight_ppm": weight,
                   "lease_expires_at": (NOW + lease).isoformat()},
        **extra,
    )


@pytest.mark.parametrize("weight", [10_000, 50_000, 250_000, 500_000])
def test_canary_share_is_within_binomial_tolerance(weight: int) -> None:
    pinned = compile_route(route(weight))
    trials = 20_000
    now = NOW.timestamp()
    hits = sum(pinned.assign(f"session-{index}".encode(), now).arm == "candidate" for index in range(trials))
    p = weight / 1_000_000
    sigma = math.sqrt(trials * p * (1 - p))
    assert abs(hits - trials * p) < 4.5 * sigma


def test_assignment_is_sticky_per_key_and_monotone_in_weight() -> None:
    low, high = compile_route(route(50_000)), compile_route(route(250_000))
    now = NOW.timestamp()
    keys = [f"tenant-{index}".encode() for index in range(2_000)]
    first = [low.assign(key, now).arm for key in keys]
    assert first == [low.assign(key, now).arm for key in keys]
    # Raising the weight only adds keys to the candidate: no conversation flips back to stable.
    assert all(high.assign(key, now).arm == "candidate" for key, arm in zip(keys, first, strict=True)
               if arm == "candidate")


def test_expired_lease_sends_everything_to_stable() -> None:
    pinned = compile_route(route(1_000_000, lease=timedelta(seconds=30)))
    before, after = NOW.timestamp() + 29, NOW.timestamp() + 30
    assert pinned.assign(b"k", before).arm == "candidate"
    assert pinned.assign(b"k", after).arm == "stable"


def test_zero_weight_and_no_candidate_mean_stable() -> None:
    assert compile_route(route(0)).assign(b"k", NOW.timestamp()).arm == "stable"


def test_shadow_sampling_rate_and_lease() -> None:
    snapshot = route(0, shadow={"fingerprint": SHADOW, "endpoints": ["http://127.0.0.1:7"], "sample_ppm": 100_000,
                                "lease_expires_at": (NOW + timedelta(minutes=5)).isoformat()})
    pinned = compile_route(snapshot)
    now = NOW.timestamp()
    sampled = sum(pinned.shadow_for(f"r{index}".encode(), now) is not None for index in range(10_000))
    assert abs(sampled - 1_000) < 4.5 * math.sqrt(10_000 * 0.1 * 0.9)
    assert all(pinned.shadow_for(f"r{index}".encode(), now + 301) is None for index in range(1_000))


def test_bucket_is_uniform_across_the_range() -> None:
    buckets = [bucket_ppm(b"salt", f"k{index}".encode()) // 100_000 for index in range(10_000)]
    counts = [buckets.count(decile) for decile in range(10)]
    assert min(counts) > 850 and max(counts) < 1_150


def test_retries_prefer_another_failure_domain() -> None:
    snapshot = route(0, failure_domains={"http://127.0.0.1:1": "rack-a", "http://127.0.0.1:2": "rack-a",
                                         "http://127.0.0.1:3": "rack-b"})
    pinned = compile_route(snapshot)
    assert retry_order(pinned.stable, pinned.failure_domains, 0) == [0, 2, 1]


@pytest.mark.parametrize(
    ("body", "tools", "expected"),
    [
        (b'{"messages":[{"role":"user","content":"hi"}]}', frozenset({"*"}), False),
        (b'{"messages":[],"tools":[{"type":"function","function":{"name":"send_email"}}]}', frozenset({"*"}), True),
        (b'{"messages":[],"tools":[{"type":"function","function":{"name":"lookup"}}]}', frozenset({"send_email"}),
         False),
        (b'{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"send_email"}}]}]}',
         frozenset({"send_email"}), True),
        (b'{"tools": [not json', frozenset({"send_email"}), True),
    ],
)
def test_side_effecting_requests_are_never_mirrored(body: bytes, tools: frozenset[str], expected: bool) -> None:
    assert side_effecting(body, tools) is expected


def test_routes_with_long_names_draw_a_new_cohort_for_each_candidate() -> None:
    # The defect: the salt was cut at blake2b's 64-byte key, so a route name of 56 characters or more
    # left no fingerprint in it and every candidate got the same sessions.
    name = "tenant-west-europe-production-chat-completions-assistant"
    assert len(name) >= 56
    sessions = [f"session-{index}".encode() for index in range(2000)]

    def cohort(candidate: str) -> set[bytes]:
        salt = f"{name}|{candidate}".encode()
        return {key for key in sessions if bucket_ppm(salt, key) < 100_000}

    first, second = cohort(CANDIDATE), cohort(SHADOW)
    assert 120 < len(first) < 280 and 120 < len(second) < 280
    assert len(first & second) < len(first) / 2  # independent draws share about a tenth


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["tools", "tool_calls", "function", "functions", "name", "messages", "type", "x"]), inner,
        max_size=4),
    max_leaves=20,
)


@given(JSON)
@settings(max_examples=400, deadline=None)
def test_the_shadow_check_is_total_over_every_json_shape(document: Any) -> None:
    body = json.dumps(document).encode()
    assert side_effecting(body, frozenset({"send_email"})) in (True, False)
    assert side_effecting(body, frozenset({"*"})) in (True, False)


def test_an_escaped_key_or_name_is_read_as_decoded() -> None:
    escaped_key = b'{"\\u0074ools":[{"type":"function","function":{"name":"send_email"}}]}'
    escaped_name = b'{"tools":[{"type":"function","function":{"name":"send\\u005femail"}}]}'
    assert side_effecting(escaped_key, frozenset({"send_email"})) is True
    assert side_effecting(escaped_name, frozenset({"send_email"})) is True
    assert side_effecting(b'{"prompt":"caf\\u00e9"}', frozenset({"send_email"})) is False


def test_an_ejected_endpoint_waits_out_a_doubling_backoff_and_an_answer_ends_it() -> None:
    ejections = Ejections()
    dead, live = ("10.0.0.1", 8000), ("10.0.0.2", 8000)
    assert ejections.live(dead, 0.0) and ejections.first_live([dead, live], 0, 0.0) == 0
    ejections.failed(dead, 100.0)
    assert not ejections.live(dead, 100.5) and ejections.live(dead, 101.0)  # 1 s, then a probe
    assert ejections.first_live([dead, live], 0, 100.5) == 1 and ejections.any_live([dead, live], 100.5)
    ejections.failed(dead, 101.0)  # the probe failed: twice as long
    assert not ejections.live(dead, 102.9) and ejections.live(dead, 103.0)
    for _ in range(10):
        ejections.failed(dead, 200.0)
    assert ejections.live(dead, 230.0) and not ejections.live(dead, 229.9)  # capped at 30 s
    assert not ejections.any_live([dead], 210.0) and ejections.first_live([dead], 0, 210.0) == 0
    ejections.answered(dead)
    assert ejections.live(dead, 210.0) and ejections.ejected == {}
