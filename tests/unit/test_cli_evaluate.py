"""`revgate trace` and `revgate gate` on files, end to end through the command parser."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from revgate.cli.main import main
from revgate.evaluation import evidence, traces
from revgate.evaluation.records import RequestRecord
from revgate.manifests.gates import GatePolicy, GateReport
from tests.unit.test_gates import arm


def write_arms(tmp_path: Path, candidate_quality: dict[str, float], latency_s: float = 0.1) -> Path:
    stable, s_scores = arm("s", 900, {"add": 0.9, "rev": 0.9, "sort": 0.9}, seed=1)
    candidate, c_scores = arm("c", 900, candidate_quality, seed=2, latency_s=latency_s)

    def labelled(records: tuple[RequestRecord, ...], scores: dict[str, float]) -> list[RequestRecord]:
        # Turn simulated scores into outputs that the reference-task grader checks.
        return [replace(r, output_text="7" if scores[r.request_id] == 1.0 else "8", reference="7") for r in records]

    path = tmp_path / "records.jsonl"
    evidence.write_records([*labelled(stable, s_scores), *labelled(candidate, c_scores)], path)
    return path


def test_gate_command_fails_a_regressed_slice_and_writes_report_and_plots(
    tmp_path: Path, policy_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = write_arms(tmp_path, {"add": 0.98, "rev": 0.6, "sort": 0.98})
    out, plots = tmp_path / "report.json", tmp_path / "plots"
    code = main(
        ["gate", str(records), "--policy", str(policy_file), "--out", str(out), "--plots", str(plots), "--final"]
    )
    printed = capsys.readouterr().out
    assert code == 1 and "FAIL" in printed and "family=rev" in printed
    report = GateReport.from_json(out.read_bytes())
    assert report.outcome == "fail" and report.policy_digest == GatePolicy.from_json(policy_file.read_bytes()).digest
    assert {p.name for p in plots.iterdir()} >= {
        "quality-per-slice.png",
        "latency-ttft-cdf.png",
        "sequential-family-rev.png",
    }
    assert all(p.stat().st_size > 5000 for p in plots.iterdir())


def test_gate_command_passes_a_better_candidate(tmp_path: Path, policy_file: Path) -> None:
    records = write_arms(tmp_path, {"add": 0.97, "rev": 0.97, "sort": 0.97})
    assert main(["gate", str(records), "--policy", str(policy_file)]) == 0


def test_gate_command_refuses_a_bad_policy_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = write_arms(tmp_path, {"add": 0.9, "rev": 0.9, "sort": 0.9})
    bad = tmp_path / "policy.json"
    bad.write_text('{"alpha": "2"}')
    out = tmp_path / "report.json"
    assert main(["gate", str(records), "--policy", str(bad), "--out", str(out)]) == 2
    assert "ManifestInvalid" in capsys.readouterr().err and not out.exists()


def test_trace_command_writes_a_readable_trace(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert (
        main(["trace", str(out), "--requests", "50", "--rate", "10", "--arrivals", "bursty", "--mix", "add/short=2"])
        == 0
    )
    assert len(traces.read_trace(out)) == 50
    assert main(["trace", str(out), "--mix", "mul/short=1"]) == 2
