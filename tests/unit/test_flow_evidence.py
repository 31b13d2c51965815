"""How a stage's evidence is assembled: batches and the report a release manager reads."""

from __future__ import annotations

from revgate.evaluation.evidence import build_evidence
from revgate.evaluation.graders import exact_match
from revgate.evaluation.records import RequestRecord
from revgate.evaluation.traces import TraceEntry
from revgate.flows.evidence import stage_batch
from revgate.flows.report import report_markdown, slice_rows

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
