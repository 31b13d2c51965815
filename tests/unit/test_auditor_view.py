"""The auditor's figures and the version description as plain functions over gate reports."""

from __future__ import annotations

from revgate.evaluation.gates import gates_from_policy, judge
from revgate.registry.auditor_view import VersionFacts, metric_name, stage_metrics, summarize, version_description
from tests.unit.test_gates import evidence, policy

EVEN = {"add": 0.8, "rev": 0.8, "sort": 0.8}


def test_stage_metrics_name_each_slice_interval_slo_and_error_rate() -> None:
    p = policy(slo=[{"ttft_ms": 200, "attainment": "0.9"}])
    report = judge(gates_from_policy(p), p, evidence(EVEN, EVEN, n=600))
    found = stage_metrics(report)
    assert (found["samples.stable"], found["samples.candidate"]) == (600.0, 600.0)
    add = [found[f"quality.family_add.{end}"] for end in ("lower", "estimate", "upper")]
    assert add == sorted(add)
    assert 0.0 <= found["slo.all.lower"] <= found["slo.all.attainment"] <= found["slo.all.upper"] <= 1.0
    assert found["errors.candidate_error_rate"] == 0.0
    assert found["gates.passed"] + found["gates.failed"] <= len(report.gates)
    assert metric_name("quality", "class=chat*") == "quality.class_chat_"


def test_the_description_lists_each_stage_and_links_the_run() -> None:
    p = policy()
    report = judge(gates_from_policy(p), p, evidence(EVEN, {"add": 0.8, "rev": 0.8, "sort": 0.3}, n=600, final=True))
    facts = VersionFacts("rolled_back", "2026-11-30T12:00:00+00:00", "dana", "key:k.pub", "sha256:" + "a" * 64,
                         "r1", "7", (summarize(report, "step01"),))
    text = version_description(facts)
    assert "[run r1](#/experiments/7/runs/r1)" in text
    assert f"| step01 | {report.outcome} | 600 | 600 | {', '.join(g.gate for g in report.failed()) or '-'} |" in text
    assert "quality" in text.splitlines()[-1]  # the slice regression fails the quality gate
