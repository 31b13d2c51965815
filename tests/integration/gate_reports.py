"""Reading a rollout's gate reports back from its MLflow evidence run, as an auditor would."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient


def last_report(client: MlflowClient, folder: Path, route: str = "demo") -> tuple[str, dict[str, Any]]:
    """The name and content of the last gate report of the route's latest evidence run."""
    experiment = client.get_experiment_by_name(f"revgate/{route}")
    assert experiment is not None
    run = client.search_runs([experiment.experiment_id])[0]
    reports = sorted(a.path for a in client.list_artifacts(run.info.run_id, "evidence")
                     if "gate-report" in a.path and a.path.endswith(".json"))
    assert reports, "no gate report"
    data: dict[str, Any] = json.loads(Path(client.download_artifacts(run.info.run_id, reports[-1], str(folder)))
                                      .read_text())
    return reports[-1], data


def evidence_counts(report: dict[str, Any]) -> dict[str, int]:
    """Requests per arm from users and from probes, as the report states them."""
    note = next(n for n in report["notes"] if n.startswith("evidence from the record sink"))
    found = re.search(r"stable (\d+) user \+ (\d+) probe requests, candidate (\d+) user \+ (\d+) probe", note)
    assert found is not None, note
    keys = ("stable_users", "stable_probes", "candidate_users", "candidate_probes")
    return dict(zip(keys, map(int, found.groups()), strict=True))


def gate(report: dict[str, Any], name: str) -> dict[str, Any]:
    """One gate's result in a report, by name."""
    found: list[dict[str, Any]] = [g for g in report["gates"] if g["gate"] == name]
    assert found, f"no gate {name!r} in {[g['gate'] for g in report['gates']]}"
    return found[0]
