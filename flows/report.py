"""Readable renderings of gate reports for the Prefect UI (approval form, artifacts)."""

from __future__ import annotations

from revgate.manifests.gates import GateReport

ICON = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE"}


def report_markdown(report: GateReport, stage: str) -> str:
    """A markdown summary: joint outcome, volumes in requests and tokens, each gate with its reason."""
    lines = [
        f"### Gates at stage `{stage}`: **{ICON[report.outcome]}**",
        "",
        f"- candidate `{report.candidate_revision[:19]}` vs stable `{report.stable_revision[:19]}`",
        f"- evidence digest `{report.evidence_digest}`",
        f"- policy digest `{report.policy_digest}`",
        "",
        "| arm | requests | admitted | rejected | prompt tokens | output tokens |",
        "|---|---|---|---|---|---|",
    ]
    for arm, volume in (("stable", report.stable), ("candidate", report.candidate)):
        lines.append(
            f"| {arm} | {volume.requests} | {volume.admitted} | {volume.rejected} "
            f"| {volume.prompt_tokens} | {volume.output_tokens} |"
        )
    lines += ["", "| gate | outcome | reason |", "|---|---|---|"]
    lines += [f"| {gate.gate} | {ICON[gate.outcome]} | {gate.reason} |" for gate in report.gates]
    failing = [(gate.gate, s) for gate in report.gates for s in gate.slices if s.outcome != "pass"]
    if failing:
        lines += ["", "| gate | slice | outcome | reason |", "|---|---|---|---|"]
        lines += [f"| {name} | {s.slice} | {ICON[s.outcome]} | {s.reason} |" for name, s in failing]
    if report.notes:
        lines += ["", *(f"> {note}" for note in report.notes)]
    return "\n".join(lines)


def slice_rows(report: GateReport) -> list[dict[str, str]]:
    """One row per gate and slice, for a Prefect table artifact."""
    rows = []
    for gate in report.gates:
        for result in gate.slices or ():
            rows.append({"gate": gate.gate, "slice": result.slice, "outcome": result.outcome, **result.numbers})
        if not gate.slices:
            rows.append({"gate": gate.gate, "slice": "*", "outcome": gate.outcome, **gate.numbers})
    return rows
