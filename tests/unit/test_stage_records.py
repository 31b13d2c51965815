"""A stage's evidence from the record sink: every router's records, users and probes each counted once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from revgate.evaluation.evidence import build_evidence
from revgate.evaluation.gates import gates_from_policy, judge
from revgate.evaluation.graders import exact_match
from revgate.evaluation.records import RequestRecord
from revgate.evaluation.traces import TraceEntry
from revgate.flows.evidence import DEMAND_LAG_S, DEMAND_WINDOW_S, RecordSource, SinkTail, StageRecords
from revgate.flows.promote import PairGrading, with_provenance
from revgate.manifests.gates import GatePolicy
from revgate.promotion.capacity import RevisionCapacity, check_capacity
from revgate.registry.record_signing import RecordSigner, new_key_pair
from revgate.registry.record_store import FolderRecordStore, ObjectName, StageWindow
from revgate.shadow.records import PairedRecord

STABLE, CANDIDATE = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def put(root: Path, kind: str, router: str, sequence: int, rows: list[str], *, dropped: int = 0) -> None:
    name = ObjectName("demo", kind, router, 1_700_000_000_000 + sequence, "b1", sequence, dropped)
    FolderRecordStore(root).put(name.key, "".join(row + "\n" for row in rows).encode())


def request(rid: str, caller: str, revision: str, *, arm: str = "stable", probe: bool = False, attempt: int = 1,
            outcome: str = "ok", generation: int = 5, output: str = "3") -> str:
    slices = {"family": "add", **({"class": "probe"} if probe else {})}
    return RequestRecord(request_id=rid, revision=revision, arm=arm, arrival_s=100.0 + attempt,  # type: ignore[arg-type]
                         outcome=outcome, attempt=attempt, route="demo", generation=generation, slices=slices,  # type: ignore[arg-type]
                         first_token_s=100.2 + attempt, last_token_s=100.5 + attempt, output_tokens=3,
                         output_text=output, caller_request_id=caller).to_json()


def pair(rid: str, output: str, e2e: float = 0.3) -> str:
    return PairedRecord(request_id=rid, route="demo", generation=5, path="/v1/completions", stable_revision=STABLE,
                        shadow_revision=CANDIDATE, stable_status=200, stable_output="3", stable_ttft_s=0.2,
                        stable_e2e_s=0.3, shadow_status=200, shadow_output=output, shadow_ttft_s=0.2,
                        shadow_e2e_s=e2e, shadow_output_tokens=3).to_json()


def probe_labels(*router_ids: str) -> dict[str, TraceEntry]:
    """The flow's labels, keyed by the router's id for each probe (as the probe's answer named it)."""
    return {r: TraceEntry(request_id=f"trace-{r}", offset_s=0.0, body={}, reference="3") for r in router_ids}


def test_canary_evidence_comes_from_every_router_once_per_request_and_names_users_and_probes(tmp_path: Path) -> None:
    put(tmp_path, "requests", "r1", 0, [request("a", "p-1", STABLE, probe=True), request("b", "u-1", CANDIDATE),
                                       request("old", "u-0", CANDIDATE, generation=4)])
    # The same request retried on the second attempt: only the last attempt counts.
    put(tmp_path, "requests", "r2", 0, [request("c", "p-2", CANDIDATE, probe=True, outcome="error", output=""),
                                       request("c", "p-2", CANDIDATE, probe=True, attempt=2, output="4")])
    records = StageRecords(str(tmp_path), "demo", StageWindow(first_generation=5), paired=False)
    records.poll()
    # "u-1" is the user's own x-request-id: a label under a caller's id never reaches a record.
    arms = records.canary(STABLE, CANDIDATE, probe_labels("a", "c", "u-1"))
    assert [r.request_id for r in arms.stable] == ["a"] and sorted(r.request_id for r in arms.candidate) == ["b", "c"]
    assert arms.counts() == {"stable_users": 0, "stable_probes": 1, "candidate_users": 1, "candidate_probes": 1}
    assert arms.per_router == {"r1": 2, "r2": 2} and not arms.lost
    proof = build_evidence(arms.stable, arms.candidate, exact_match)
    assert proof.stable_scores == {"a": 1.0} and proof.candidate_scores == {"c": 0.0}  # users carry no reference
    records.poll()  # nothing new: nothing counted twice
    assert len(records.canary(STABLE, CANDIDATE, {}).candidate) == 2
    assert "1 user + 1 probe" in arms.note()


def test_shadow_pairs_join_the_callers_records_and_feed_the_paired_gates(tmp_path: Path) -> None:
    callers = [request(f"r{i}", f"p-{i}" if i % 2 else f"u-{i}", STABLE, probe=bool(i % 2)) for i in range(80)]
    put(tmp_path, "requests", "r1", 0, callers)
    put(tmp_path, "paired", "r1", 0, [pair(f"r{i}", "3", e2e=1.0) for i in range(80)])  # same answers, 3.3x slower
    records = StageRecords(str(tmp_path), "demo", StageWindow(first_generation=5), paired=True)
    records.poll()
    arms = records.shadow(probe_labels(*(f"r{i}" for i in range(1, 80, 2))))
    assert len(arms.stable) == len(arms.candidate) == 80
    assert {r.arm for r in arms.candidate} == {"candidate"} and arms.candidate[1].reference == "3"
    policy = GatePolicy.build(slice_keys=["family"], latency_metrics=["e2e"], min_samples_per_slice=20,
                              max_samples_per_stage=80, look_every=20, paired={
                                  "latency_margin": "0.8", "latency_metrics": ["e2e"], "max_pairs_per_stage": 80,
                                  "look_every": 20, "graders": [{"name": "reference", "kind": "reference"},
                                                                {"name": "answered", "kind": "not-empty"}]})
    spec_like = type("Spec", (), {"gate_policy": policy, "judge_url": "", "judge_model": ""})()
    scores = PairGrading(spec_like).scores(arms)
    assert len(scores["answered"]) == 80  # label-free: users' prompts too
    proof = build_evidence(arms.stable, arms.candidate, exact_match, final=True, pair_scores=scores)
    assert len(proof.stable_scores) == 40  # reference grading where the probes' labels exist
    report = judge(gates_from_policy(policy, paired_evidence=True), policy, proof)
    latency = next(g for g in report.gates if g.gate == "latency-paired-e2e")
    assert latency.outcome == "fail" and report.outcome == "fail"


def test_lost_evidence_is_reported_and_never_a_pass(tmp_path: Path) -> None:
    put(tmp_path, "requests", "r1", 0, [request(f"s{i}", f"u-s{i}", STABLE) for i in range(40)])
    put(tmp_path, "requests", "r1", 2, [request(f"c{i}", f"u-c{i}", CANDIDATE) for i in range(40)], dropped=3)
    records = StageRecords(str(tmp_path), "demo", StageWindow(first_generation=5), paired=False)
    records.poll()
    arms = records.canary(STABLE, CANDIDATE, probe_labels(*(f"{arm}{i}" for arm in "sc" for i in range(40))))
    assert any("gap" in lost for lost in arms.lost) and any("dropped" in lost for lost in arms.lost)
    policy = GatePolicy.build(latency_metrics=[], quality_margin="0.1", error_margin="0.1",
                              min_samples_per_slice=20, max_samples_per_stage=40, look_every=20)
    report = judge(gates_from_policy(policy), policy, build_evidence(arms.stable, arms.candidate, exact_match))
    assert report.outcome == "pass", [(g.gate, g.reason) for g in report.gates]  # the records alone would pass
    shown = with_provenance(report, arms)
    assert shown.outcome == "inconclusive" and any("missing evidence" in note for note in shown.notes)


def test_an_unreachable_store_is_missing_evidence(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text(json.dumps({}))
    records = StageRecords(str(blocker), "demo", StageWindow(), paired=False)
    (tmp_path / "file").unlink()
    (tmp_path / "file").mkdir()
    (tmp_path / "file" / "demo").write_text("not a folder")  # listing the route's records fails
    records.poll()
    assert any("unavailable" in problem for problem in records.problems())


# --- who wrote what: signed objects, duplicates -------------------------------------------------


def test_requests_that_fell_back_to_stable_are_the_candidates_failures_and_fail_its_error_gate(tmp_path: Path) -> None:
    # The defect: a request the route gave the candidate, sent to stable because no candidate replica took it,
    # was only a metric. Its record said stable served it, so a canary whose replicas had all died showed fewer
    # requests and no failures, and could pass on the answers it had before.
    from dataclasses import replace

    def fell_back(rid: str) -> str:
        return replace(RequestRecord.from_json(request(rid, f"u-{rid}", STABLE)), fallback_from=CANDIDATE).to_json()

    put(tmp_path, "requests", "r1", 0, [request(f"s{i}", f"u-s{i}", STABLE) for i in range(40)])
    put(tmp_path, "requests", "r1", 1, [request(f"c{i}", f"u-c{i}", CANDIDATE) for i in range(20)])
    put(tmp_path, "requests", "r1", 2, [fell_back(f"f{i}") for i in range(20)])
    records = StageRecords(str(tmp_path), "demo", StageWindow(first_generation=5), paired=False)
    records.poll()
    arms = records.canary(STABLE, CANDIDATE, {})
    assert len(arms.stable) == 40 and len(arms.candidate) == 40 and arms.fallbacks == 20
    failures = [r for r in arms.candidate if r.request_id.startswith("f")]
    seen = {(r.revision, r.outcome, r.first_token_s, r.output_text) for r in failures}
    assert seen == {(CANDIDATE, "error", None, None)}
    assert "20 of the candidate's went to stable" in arms.note()
    policy = GatePolicy.build(latency_metrics=[], quality_margin="0.1", error_margin="0.1",
                              min_samples_per_slice=20, max_samples_per_stage=40, look_every=20)
    report = judge(gates_from_policy(policy), policy, build_evidence(arms.stable, arms.candidate, exact_match))
    assert report.outcome == "fail"
    failed = [g.gate for g in report.gates if g.outcome == "fail"]
    assert any("error" in gate for gate in failed), [(g.gate, g.reason) for g in report.gates]


def signed_put(root: Path, signer: RecordSigner, router: str, sequence: int, rows: list[str]) -> str:
    name = ObjectName("demo", "requests", router, 1_700_000_000_000 + sequence, "b1", sequence)
    body = "".join(row + "\n" for row in rows).encode()
    FolderRecordStore(root).put(name.key, signer.sign(name.key, body))
    return str(root / name.key)


def passing_report(arms: Any) -> Any:
    policy = GatePolicy.build(latency_metrics=[], quality_margin="0.1", error_margin="0.1",
                              min_samples_per_slice=20, max_samples_per_stage=40, look_every=20)
    report = judge(gates_from_policy(policy), policy, build_evidence(arms.stable, arms.candidate, exact_match))
    assert report.outcome == "pass", [(g.gate, g.reason) for g in report.gates]
    return report


def test_a_forged_higher_attempt_cannot_replace_a_real_record_nor_hold_the_stage(tmp_path: Path) -> None:
    key = new_key_pair(tmp_path / "r1.key")
    store = tmp_path / "store"
    signed_put(store, key, "r1", 0, [request(f"s{i}", f"u-s{i}", STABLE) for i in range(40)])
    signed_put(store, key, "r1", 1, [request(f"c{i}", f"u-c{i}", CANDIDATE) for i in range(40)])
    # Anyone who can write to the store: a record of a real request at a higher attempt, unsigned or
    # signed by another key, under the real router's folder with the next sequence number; and a stray.
    put(store, "requests", "r1", 2, [request("c0", "u-c0", CANDIDATE, attempt=9, outcome="error", output="")])
    stranger = new_key_pair(tmp_path / "stranger.key")
    forged = signed_put(store, stranger, "r1", 3, [request("c1", "u-c1", CANDIDATE, attempt=9, output="x")])
    (store / "demo/requests/r1/stray.txt").write_text("not a record")
    signers = {"r1": key.public_pem().decode()}
    records = StageRecords(str(store), "demo", StageWindow(first_generation=5), paired=False, signers=signers)
    records.poll()
    assert records.by_id["c0"].attempt == 1 and records.by_id["c1"].output_text == "3"  # the real records
    assert not records.lost and len(records.refused) == 3
    assert any(forged in item and "does not match" in item for item in records.refused)
    arms = records.canary(STABLE, CANDIDATE, probe_labels(*(f"{arm}{i}" for arm in "sc" for i in range(40))))
    shown = with_provenance(passing_report(arms), arms, records.refused)
    assert shown.outcome == "pass"  # a forged object is reported, and holds no rollout
    assert sum(note.startswith("refused as evidence: forged") for note in shown.notes) == 3


def test_a_duplicate_record_is_refused_with_both_keys_and_the_first_kept(tmp_path: Path) -> None:
    put(tmp_path, "requests", "r1", 0, [request("a", "u-1", STABLE, output="3")])
    put(tmp_path, "requests", "r1", 1, [request("a", "u-1", STABLE, output="4")])  # the same attempt again
    put(tmp_path, "requests", "r2", 0, [request("a", "u-1", STABLE, attempt=5, output="5")])  # another router's
    put(tmp_path, "paired", "r1", 0, [pair("a", "3"), pair("a", "9")])
    records = StageRecords(str(tmp_path), "demo", StageWindow(first_generation=5), paired=True)
    records.poll()
    assert records.by_id["a"].output_text == "3" and records.pairs["a"].shadow_output == "3"
    first = str(tmp_path / ObjectName("demo", "requests", "r1", 1_700_000_000_000, "b1", 0).key)
    again = str(tmp_path / ObjectName("demo", "requests", "r1", 1_700_000_000_001, "b1", 1).key)
    other = str(tmp_path / ObjectName("demo", "requests", "r2", 1_700_000_000_000, "b1", 0).key)
    duplicates = [item for item in records.refused if item.startswith("duplicate record a")]
    assert len(duplicates) == 2 and all(first in item for item in duplicates)
    assert any(again in item for item in duplicates) and any(other in item for item in duplicates)
    assert any(item.startswith("duplicate pair a") for item in records.refused)
    assert not records.lost  # nothing is missing: the first is kept


def test_the_rollback_windows_tail_reads_only_the_named_routers_signed_records(tmp_path: Path) -> None:
    key = new_key_pair(tmp_path / "r1.key")
    store = tmp_path / "store"
    signed_put(store, key, "r1", 0, [request("a", "u-a", STABLE)])
    put(store, "requests", "r1", 1, [request("b", "u-b", STABLE)])  # unsigned, under the named router
    put(store, "requests", "r9", 0, [request("c", "u-c", STABLE)])  # a router the route does not name
    tail = SinkTail(str(store), "demo", 0.0, {"r1": key.public_pem().decode()})
    assert [record.request_id for record in tail.poll()] == ["a"] and tail.poll() == []
    assert sorted(record.request_id for record in SinkTail(str(store), "demo", 0.0).poll()) == ["a", "b", "c"]


# --- the capacity rule's demand: every router's records in the sink -----------------------------


def user(rid: str, arrival_s: float, *, arm: str = "stable", probe: bool = False, attempt: int = 1) -> str:
    slices = {"class": "probe"} if probe else {}
    return RequestRecord(request_id=rid, revision=STABLE, arm=arm, arrival_s=arrival_s, outcome="ok",  # type: ignore[arg-type]
                         attempt=attempt, route="demo", generation=5, slices=slices).to_json()


def put_at(root: Path, router: str, written_s: float, sequence: int, rows: list[str]) -> None:
    name = ObjectName("demo", "requests", router, int(written_s * 1000), "b1", sequence)
    FolderRecordStore(root).put(name.key, "".join(row + "\n" for row in rows).encode())


def test_demand_is_every_routers_users_each_request_once(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    until = now - DEMAND_LAG_S
    since = until - DEMAND_WINDOW_S
    # Edge 1: 30 users over the window, one retried (its second attempt is the same request).
    put_at(tmp_path, "edge-1", since + 10, 0, [user(f"a{i}", since + i * 0.3) for i in range(30)])
    put_at(tmp_path, "edge-1", since + 20, 1, [user("a3", since + 0.9, attempt=2)])
    # Edge 2: 15 users, and what is no demand: the rollout's probes, the shadow's copies, requests before the
    # window, and requests inside the lag (counted by the next look, not this one).
    put_at(tmp_path, "edge-2", since + 25, 0, [
        *(user(f"b{i}", since + 15 + i) for i in range(15)),
        *(user(f"p{i}", since + 16, probe=True) for i in range(20)),
        *(user(f"s{i}", since + 17, arm="shadow") for i in range(20)),
        user("early", since - 1), user("late", until + 0.5),
    ])
    demand = RecordSource(str(tmp_path), "demo").demand(now)
    assert demand.rps == pytest.approx(45 / DEMAND_WINDOW_S)  # one router's file alone would have said 30 or 15
    assert not demand.unavailable and set(demand.per_router) == {"edge-1", "edge-2"}


def test_demand_that_cannot_be_read_fails_the_capacity_rule_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "demo").write_text("not a folder")  # listing the route's records fails
    demand = RecordSource(str(tmp_path), "demo").demand(1_800_000_000.0)
    assert demand.unavailable
    check = check_capacity({STABLE: 1.0}, {STABLE: RevisionCapacity(4, 40.0)}, demand_rps=demand.rps,
                           target_utilisation=0.8, demand_unknown=demand.unavailable)
    assert not check.ok and "demand is unknown" in check.reason  # never "0 req/s, one replica is enough"


def test_demand_counts_only_the_named_routers_signed_records(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    key = new_key_pair(tmp_path / "edge-1.key")
    store = tmp_path / "store"
    name = ObjectName("demo", "requests", "edge-1", int((now - 10) * 1000), "b1", 0)
    body = "".join(user(f"a{i}", now - 20 + i * 0.1) + "\n" for i in range(12)).encode()
    FolderRecordStore(store).put(name.key, key.sign(name.key, body))
    put_at(store, "intruder", now - 10, 0, [user(f"x{i}", now - 20) for i in range(300)])  # unnamed, unsigned
    demand = RecordSource(str(store), "demo", {"edge-1": key.public_pem().decode()}).demand(now)
    assert demand.rps == pytest.approx(12 / DEMAND_WINDOW_S)
