"""How a stage's evidence is assembled: batches, arms by serving revision, shadow pairs."""

from __future__ import annotations

from pathlib import Path

from revgate.evaluation.evidence import build_evidence
from revgate.evaluation.graders import exact_match
from revgate.evaluation.records import RequestRecord
from revgate.evaluation.traces import TraceEntry
from revgate.flows.evidence import PairedRecordsTail, canary_arms, settled_pairs, shadow_arms, stage_batch
from revgate.flows.report import report_markdown, slice_rows
from revgate.shadow.records import PairedRecord

STABLE, CANDIDATE = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def entries(n: int) -> list[TraceEntry]:
    return [
        TraceEntry(request_id=f"t-{i}", offset_s=10.0 + i, body={"prompt": f"add {i}+1="}, slices={"family": "add"},
                   tenant="tenant-a", reference=str(i + 1))
        for i in range(n)
    ]


def record(request_id: str, revision: str, output: str, reference: str) -> RequestRecord:
    return RequestRecord(request_id=request_id, revision=revision, arm="direct", arrival_s=100.0, outcome="ok",
                         first_token_s=100.1, last_token_s=100.3, output_tokens=2, output_text=output,
                         reference=reference, slices={"family": "add"})


def test_batches_are_retimed_reidentified_and_wrap_around() -> None:
    batch = stage_batch(entries(5), "step01", 1, 4)
    assert [e.request_id for e in batch] == ["step01-b1-t-4", "step01-b1-t-0", "step01-b1-t-1", "step01-b1-t-2"]
    assert batch[0].offset_s == 0.0  # re-timed to start now
    assert {e.reference for e in batch} == {"5", "1", "2", "3"}
    assert all(e.slices == {"family": "add", "class": "probe"} for e in batch)  # marked as the flow's probes


def test_canary_arms_follow_the_revision_that_served_each_request() -> None:
    records = [record("a", STABLE, "1", "1"), record("b", CANDIDATE, "2", "2"), record("c", "other", "3", "3")]
    stable, candidate = canary_arms(records, STABLE, CANDIDATE)
    assert [r.request_id for r in stable] == ["a"] and [r.request_id for r in candidate] == ["b"]
    assert {r.arm for r in stable} == {"stable"} and {r.arm for r in candidate} == {"candidate"}


def test_shadow_arms_pair_the_same_prompts_and_grade_the_shadow_output() -> None:
    trace = entries(3)
    callers = [record(e.request_id, STABLE, e.reference or "", e.reference or "") for e in trace]
    pair = PairedRecord(
        request_id="0f3a9c", caller_request_id="t-1", route="r", generation=2, path="/v1/completions",
        stable_revision=STABLE,
        shadow_revision=CANDIDATE, stable_status=200, stable_output="2", stable_ttft_s=0.1, stable_e2e_s=0.3,
        shadow_status=200, shadow_output="wrong", shadow_ttft_s=0.2, shadow_e2e_s=0.5,
        shadow_prompt_tokens=11, shadow_output_tokens=3,
    )
    stable, candidate = shadow_arms(callers, [pair], trace)
    # The candidate's volume in the report counts the shadow's own tokens.
    assert (candidate[0].prompt_tokens, candidate[0].output_tokens) == (11, 3)
    assert [r.request_id for r in stable] == ["t-1"] == [r.request_id for r in candidate]  # unmirrored ones left out
    assert candidate[0].revision == CANDIDATE and candidate[0].ttft_s is not None and candidate[0].reference == "2"
    proof = build_evidence(stable, candidate, exact_match, expected_candidate_share=None, final=False)
    assert proof.stable_scores == {"t-1": 1.0} and proof.candidate_scores == {"t-1": 0.0}


def test_the_report_a_release_manager_reads_names_outcome_volumes_and_gates() -> None:
    from revgate.evaluation.gates import gates_from_policy, judge
    from revgate.manifests.gates import GatePolicy

    trace = entries(40)
    stable = [record(e.request_id, STABLE, e.reference or "", e.reference or "") for e in trace]
    candidate = [record(e.request_id + "c", CANDIDATE, "x", e.reference or "") for e in trace]
    policy = GatePolicy()
    report = judge(gates_from_policy(policy), policy, build_evidence(stable, candidate, exact_match,
                                                                   expected_candidate_share=None, final=True))
    text = report_markdown(report, "step03")
    assert "step03" in text and report.evidence_digest in text
    assert "| candidate | 40 |" in text
    assert all(f"| {gate.gate} |" in text for gate in report.gates)
    assert {row["gate"] for row in slice_rows(report)} == {gate.gate for gate in report.gates}


def test_the_pairs_tail_reads_only_new_complete_lines_of_its_stage(tmp_path: Path) -> None:
    def pair(request_id: str) -> str:
        return PairedRecord(
            request_id="router-" + request_id, caller_request_id=request_id, route="r", generation=2,
            path="/v1/completions", stable_revision=STABLE,
            shadow_revision=CANDIDATE, stable_status=200, stable_output="1", stable_ttft_s=0.1, stable_e2e_s=0.2,
            shadow_status=200, shadow_output="1", shadow_ttft_s=0.1, shadow_e2e_s=0.2,
        ).to_json()

    path = tmp_path / "paired.jsonl"
    tail = PairedRecordsTail(path, "step01-")
    assert tail.poll() == 0  # no file yet
    path.write_text(pair("step01-b0-a") + "\n" + pair("step00-b0-x") + "\n" + pair("step01-b0-b")[:20])
    assert tail.poll() == 1  # the other stage's pair is skipped, the half-written line waits
    with path.open("a") as handle:
        handle.write(pair("step01-b0-b")[20:] + "\n")
    assert tail.poll() == 2
    assert [p.caller_request_id for p in settled_pairs(tail, expected=2)] == ["step01-b0-a", "step01-b0-b"]


def test_observed_demand_leaves_out_the_rollouts_own_probes_and_only_them(tmp_path: Path) -> None:
    import json

    from revgate.flows.evidence import live_arrivals

    records = tmp_path / "records.jsonl"
    lines = [
        {"request_id": "r1", "caller_request_id": "", "arrival_s": 100.0, "slices": {}},  # a user
        # A caller naming its requests like the flow's probes is still demand: only the label counts, and
        # the router takes that label only from a request with the rollout's probe credential.
        {"request_id": "r2", "caller_request_id": "step01-b0-t7", "arrival_s": 101.0, "slices": {}},
        {"request_id": "r3", "arrival_s": 102.0, "slices": {"class": "probe"}},  # a labelled probe
        {"request_id": "r4", "arrival_s": 50.0, "slices": {}},  # before the window
    ]
    records.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"request_id": "cut', encoding="utf-8")
    assert live_arrivals(records, since_s=60.0) == [100.0, 101.0]
