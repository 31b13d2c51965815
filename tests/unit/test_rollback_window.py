"""The rollback window's verdict: the promoted revision's own failures against the old stable's, by
confidence sequences (the defect: it reverted on 5% of 20 requests, callers' 4xx and deadlines counted,
with no baseline)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from revgate.evaluation.records import CALLER_DEADLINE, ROUTE_DEADLINE, Outcome, RequestRecord
from revgate.flows.evidence import SinkTail
from revgate.manifests.rollout import PostPromotionCheck
from revgate.promotion.window import ArmTally, WindowTally, tally, window_verdict
from revgate.registry.record_store import FolderRecordStore, ObjectName

OLD, NEW = "sha256:" + "1" * 64, "sha256:" + "2" * 64
PROMOTED_AT = 100.0


def record(outcome: Outcome = "ok", *, revision: str = NEW, arrival: float = PROMOTED_AT + 1, e2e: float = 0.1,
           status: int | None = None, error: str = "") -> RequestRecord:
    return RequestRecord(request_id="r", revision=revision, arm="stable", arrival_s=arrival, outcome=outcome,
                         first_token_s=arrival + e2e / 2, last_token_s=arrival + e2e, status_code=status, error=error)


def verdict(check: PostPromotionCheck, promoted: list[RequestRecord], stable: list[RequestRecord] = ()) -> str:
    seen = tally(WindowTally(), [*stable, *promoted], check, promoted=NEW, old_stable=OLD, promoted_at_s=PROMOTED_AT)
    return window_verdict(check, seen).outcome


def before(outcome: Outcome = "ok", **fields: object) -> RequestRecord:
    return record(outcome, revision=OLD, arrival=PROMOTED_AT - 1, **fields)  # type: ignore[arg-type]


CHECK = PostPromotionCheck.build(min_requests=20, max_error_rate="0.05")


def test_a_few_unlucky_requests_revert_nothing_and_a_broken_revision_is_reverted() -> None:
    assert verdict(CHECK, [record("error")] * 19) == "watching"  # under min_requests
    assert verdict(CHECK, [record()] * 18 + [record("error")] * 2, [before()] * 500) == "healthy"  # 10% of 20
    assert verdict(CHECK, [record()] * 20 + [record("error")] * 20, [before()] * 500) == "fail"


def test_only_the_revisions_own_failures_count() -> None:
    callers = ([record("error", status=400)] * 30 + [record("timeout", error=CALLER_DEADLINE)] * 30
               + [record("cancelled")] * 30 + [record("rejected")] * 30)
    assert verdict(CHECK, [record()] * 20 + callers, [before()] * 500) == "healthy"
    own = [record("error", status=502)] * 15 + [record("timeout", error=ROUTE_DEADLINE)] * 15 + [record("error")] * 5
    assert verdict(CHECK, [record()] * 20 + own, [before()] * 500) == "fail"


def test_the_old_stables_rate_while_both_served_is_the_baseline() -> None:
    flaky_stable = [before()] * 900 + [before("error")] * 100  # 10% while both served: the callers' traffic
    as_flaky = [record()] * 880 + [record("error")] * 120
    assert verdict(CHECK, as_flaky, flaky_stable) == "healthy"
    assert verdict(CHECK, as_flaky, [before()] * 1000) == "fail"
    assert verdict(CHECK, [record()] * 600 + [record("error")] * 400, flaky_stable) == "fail"
    # The promoted revision before promotion, and the old stable after it, are neither side.
    assert verdict(CHECK, [record("error", arrival=PROMOTED_AT - 1)] * 50 + [record()] * 20,
                   [record("error", revision=OLD)] * 50) == "healthy"


def test_latency_targets_against_the_old_stables_attainment() -> None:
    check = PostPromotionCheck.build(min_requests=20, e2e_ms=500, attainment="0.9")
    slow = [record()] * 100 + [record(e2e=0.9)] * 100
    assert verdict(check, slow, [before()] * 500) == "fail"
    # Stable itself met the targets half the time while both served: the promoted revision is held to that.
    assert verdict(check, slow, [before()] * 500 + [before(e2e=0.9)] * 500) == "healthy"


def test_an_equal_revision_watched_at_every_look_is_reverted_at_most_alpha_of_the_time() -> None:
    # 200 windows of 2,000 requests at stable's own 2% failure rate, a look every 40 requests: the
    # confidence sequence holds at every look, so false reverts stay under alpha (5%) with no
    # tolerance, and at 0 with the default 5 points.
    rng = np.random.default_rng(7)
    exact = PostPromotionCheck.build(min_requests=20, max_error_rate="0")
    false_reverts = {"tolerance 0": 0, "default": 0}
    for _ in range(200):
        base = ArmTally(2000, int((rng.random(2000) < 0.02).sum()), 2000)
        failures = np.cumsum(rng.random(2000) < 0.02)
        for name, check in (("tolerance 0", exact), ("default", CHECK)):
            looks = (WindowTally(ArmTally(n, int(failures[n - 1]), n), base) for n in range(40, 2001, 40))
            false_reverts[name] += any(window_verdict(check, seen).outcome == "fail" for seen in looks)
    assert false_reverts["tolerance 0"] <= 10, false_reverts  # 5% of 200
    assert false_reverts["default"] == 0, false_reverts


def test_the_window_reads_from_where_the_rollout_began_and_keeps_nothing(tmp_path: Path) -> None:
    def put(sequence: int, written_s: float, *records: RequestRecord) -> None:
        name = ObjectName("demo", "requests", "edge-1", int(written_s * 1000), "b1", sequence)
        FolderRecordStore(tmp_path).put(name.key, "".join(r.to_json() + "\n" for r in records).encode())

    began = PROMOTED_AT - 50
    put(0, began + 1, record("error", arrival=began - 5), record(arrival=began + 0.5))  # one before the rollout
    tail = SinkTail(str(tmp_path), "demo", began)
    assert [r.arrival_s for r in tail.poll()] == [began + 0.5]
    assert tail.poll() == []  # read once
    put(1, began + 2, record("error", arrival=began + 1.5))
    assert [r.outcome for r in tail.poll()] == ["error"]
