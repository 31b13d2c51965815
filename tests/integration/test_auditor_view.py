"""The auditor's view in MLflow on a real SQLite store: the version's description and tags, metrics per
stage that MLflow charts, each gate report readable beside its JSON, plots, all checked by the audit."""

from __future__ import annotations

from pathlib import Path

import pytest

from revgate.evaluation import plots
from revgate.evaluation.gates import gates_from_policy, judge
from revgate.flows.report import report_markdown
from revgate.registry.auditor_view import VersionFacts
from revgate.registry.ledger import EvidenceLedger, sqlite_uri
from tests.integration.commands import revgate
from tests.unit.test_gates import evidence, policy

pytestmark = pytest.mark.servers

EVEN = {"add": 0.8, "rev": 0.8, "sort": 0.8}
FINGERPRINT = "sha256:" + "5" * 64


OUTCOMES: dict[int, str] = {}  # each stage's joint outcome, as judged when the rollout was logged


def rollout_with_two_stages(tmp_path: Path) -> tuple[EvidenceLedger, str, str]:
    """A promoted run with two gate reports (markdown and plots beside them) and a described version."""
    ledger = EvidenceLedger(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "artifacts")
    run = ledger.open_run("chat", FINGERPRINT)
    gate_policy = policy()
    for stage, samples in enumerate((300, 600)):
        proof = evidence(EVEN, EVEN, n=samples, final=stage == 1)
        report = judge(gates_from_policy(gate_policy), gate_policy, proof)
        OUTCOMES[stage] = report.outcome
        name = f"gate-report-{stage + 1:02d}-step{stage:02d}"
        ledger.log_gate_report(run, name, report, report_markdown(report, f"step{stage:02d}"), stage)
    ledger.log_attachment(run, plots.quality_per_slice(proof, gate_policy, tmp_path / "quality-per-slice.png"))
    version = ledger.register_version(run, "chat-model", FINGERPRINT)
    facts = VersionFacts(decision="promoted", decided_at="2026-11-30T12:00:00+00:00", approver="dana",
                         signer="release@example.com", manifest_digest="sha256:" + "a" * 64, run_id=run.run_id,
                         experiment_id=run.experiment_id, stages=ledger.stage_summaries(run.run_id))
    ledger.describe_version("chat-model", version, facts)
    ledger.close(run, "promoted")
    return ledger, run.run_id, version


def test_the_version_page_states_decision_approver_gates_and_links_the_run(tmp_path: Path) -> None:
    ledger, run_id, number = rollout_with_two_stages(tmp_path)
    version = ledger.client.get_model_version("chat-model", number)
    assert version.description.startswith("**Decision: promoted** at 2026-11-30T12:00:00+00:00, approved by **dana**")
    assert f"[run {run_id}](#/experiments/" in version.description
    assert f"| step00 | {OUTCOMES[0]} | 300 | 300 | - |" in version.description
    assert f"| step01 | {OUTCOMES[1]} | 600 | 600 | - |" in version.description
    assert version.tags["revgate.manifest_digest"] == "sha256:" + "a" * 64
    assert (version.tags["revgate.signer"], version.tags["revgate.decision"], version.tags["revgate.approver"]) == (
        "release@example.com", "promoted", "dana")


def test_stage_figures_are_metrics_with_the_stage_as_step(tmp_path: Path) -> None:
    ledger, run_id, _ = rollout_with_two_stages(tmp_path)
    history = ledger.client.get_metric_history(run_id, "samples.candidate")
    assert sorted((m.step, m.value) for m in history) == [(0, 300.0), (1, 600.0)]
    for key in ("quality.family_add.lower", "quality.family_add.upper", "quality.family_add.estimate",
                "errors.candidate_error_rate", "latency-ttft.upper"):
        steps = sorted(m.step for m in ledger.client.get_metric_history(run_id, key))
        assert steps == [0, 1], key
    lower = ledger.client.get_metric_history(run_id, "quality.family_add.lower")[-1].value
    upper = ledger.client.get_metric_history(run_id, "quality.family_add.upper")[-1].value
    assert lower < upper


def test_the_readable_report_and_plots_are_checked_by_the_audit(tmp_path: Path) -> None:
    ledger, run_id, _ = rollout_with_two_stages(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    artifacts = Path(ledger.client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / "evidence"
    markdown = (artifacts / "gate-report-02-step01.md").read_text()
    assert markdown.startswith("### Gates at stage `step01`: **") and "| candidate | 600 |" in markdown
    intact = revgate("evidence", FINGERPRINT, "--tracking-uri", uri, "--model", "chat-model")
    assert intact.returncode == 0, intact.stdout + intact.stderr
    assert "ok       evidence/gate-report-02-step01.md" in intact.stdout
    assert "ok       evidence/quality-per-slice.png" in intact.stdout
    (artifacts / "gate-report-02-step01.md").write_text(markdown.replace("| candidate | 600 |", "| candidate | 6000 |"))
    edited = revgate("evidence", FINGERPRINT, "--tracking-uri", uri, "--model", "chat-model")
    assert edited.returncode == 4, edited.stdout + edited.stderr
    assert "mismatch evidence/gate-report-02-step01.md  expected sha256:" in edited.stdout
    assert "ok       evidence/gate-report-02-step01.json" in edited.stdout  # the JSON beside it is untouched


def test_a_stages_figures_are_drawn_logged_and_audited(tmp_path: Path) -> None:
    from revgate.flows.auditor import log_stage_plots, plot_stage, version_facts
    from tests.integration.test_flow_lock import spec

    promotion = spec(tmp_path, "chat").model_copy(update={"gate_policy": policy()})
    proof = evidence(EVEN, {"add": 0.8, "rev": 0.8, "sort": 0.4}, n=600)
    drawn = plot_stage(promotion, "step02", proof)
    assert sorted(path.name for path in drawn) == ["step02-e2e-cdf.png", "step02-quality-per-slice.png",
                                                   "step02-sequential-family_sort.png", "step02-ttft-cdf.png"]
    ledger = EvidenceLedger(promotion.tracking_uri, tmp_path / "artifacts")
    run = ledger.open_run("chat", FINGERPRINT)
    log_stage_plots(ledger, run, promotion, "step02")
    ledger.log_json(run, "approval", {"approve": True, "evidence_digest": "sha256:" + "e" * 64, "approver": "dana"})
    facts = version_facts(ledger, run, promotion, "promoted")
    assert (facts.approver, facts.signer, facts.manifest_digest) == ("dana", "key:k.pub", "sha256:" + "2" * 64)
    ledger.close(run, "promoted")
    result = revgate("evidence", FINGERPRINT, "--tracking-uri", promotion.tracking_uri)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok       evidence/step02-sequential-family_sort.png" in result.stdout
    stored = Path(ledger.client.get_run(run.run_id).info.artifact_uri.removeprefix("file://")) / "evidence"
    (stored / "step02-ttft-cdf.png").write_bytes(b"another figure")
    assert revgate("evidence", FINGERPRINT, "--tracking-uri", promotion.tracking_uri).returncode == 4


@pytest.mark.timeout(300)
def test_an_auditor_follows_the_version_description_to_the_readable_report(tmp_path: Path) -> None:

    from playwright.sync_api import expect

    from revgate.flows.processes import mlflow_ui
    from tests.integration.browser import browser_page, screenshot

    _, run_id, number = rollout_with_two_stages(tmp_path)
    with mlflow_ui(sqlite_uri(tmp_path / "mlflow.db"), tmp_path / "mlflow-server.log") as ui, browser_page() as page:
        page.goto(f"{ui}/#/models/chat-model/versions/{number}")
        expect(page.get_by_text("Decision: promoted").first).to_be_visible(timeout=60_000)
        expect(page.get_by_text("dana").first).to_be_visible(timeout=60_000)
        screenshot(page, "mlflow-model-version.png", tmp_path)  # the auditor's starting point, for the docs
        with page.context.expect_page(timeout=60_000) as opened:  # MLflow opens description links in a new tab
            page.get_by_role("link", name=f"run {run_id}").first.click(timeout=60_000)
        run_page = opened.value
        run_page.get_by_role("tab", name="Artifacts").click(timeout=60_000)
        report = run_page.get_by_text("gate-report-02-step01.md")
        folder = run_page.get_by_text("evidence", exact=True).first
        folder.wait_for(timeout=60_000)
        if not report.is_visible():  # a tree with several files starts with the folder closed
            folder.click()
        report.click(timeout=60_000)
        expect(run_page.get_by_text("Gates at stage").first).to_be_visible(timeout=60_000)
