"""An auditor's check of a revision's evidence: every document a promotion run names by digest is
present, and its bytes hash to that digest.

Pure: the ledger fetches tags and bytes, this module judges and renders. A decision whose evidence
was altered or lost after the fact is unproven, whatever the run's tags say.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from manifests.canonical import sha256_digest

DIGEST_TAG = "revgate.digest."
STEP_TAG = "revgate.step."

CheckStatus = Literal["ok", "mismatch", "missing"]
ATTACHED_SUFFIXES = (".md", ".png", ".html")  # readable renderings and plots, stored under their own names


def attached(name: str) -> bool:
    """Whether an evidence name is a file kept under its own name (a report's markdown, a plot), not JSON."""
    return name.endswith(ATTACHED_SUFFIXES)


@dataclass(frozen=True, slots=True)
class DocumentCheck:
    """One evidence document: the digest the run recorded and the digest of the bytes stored now."""

    name: str
    expected: str
    actual: str | None  # None when the document is gone

    @property
    def status(self) -> CheckStatus:
        """ok, mismatch (altered after it was logged) or missing."""
        if self.actual is None:
            return "missing"
        return "ok" if self.actual == self.expected else "mismatch"

    @property
    def path(self) -> str:
        """Where the document lies among the run's artifacts (a readable file keeps its own suffix)."""
        return f"evidence/{self.name}" if attached(self.name) else f"evidence/{self.name}.json"


@dataclass(frozen=True, slots=True)
class RunEvidence:
    """One promotion attempt of a revision as its evidence run records it."""

    run_id: str
    route: str
    candidate: str
    decision: str
    started_ms: int
    steps: tuple[tuple[str, str], ...]
    documents: tuple[DocumentCheck, ...]
    approval: Mapping[str, Any] | None
    approved_report: str | None = None  # the gate report whose evidence the approval names

    @property
    def intact(self) -> bool:
        """Every document named by digest is present and unaltered."""
        return all(check.status == "ok" for check in self.documents)


def recorded_digests(tags: Mapping[str, str]) -> dict[str, str]:
    """Document name -> digest, from the run's ``revgate.digest.NAME`` tags."""
    return {key.removeprefix(DIGEST_TAG): value for key, value in tags.items() if key.startswith(DIGEST_TAG)}


def recorded_steps(tags: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(step, outcome) pairs from the run's ``revgate.step.STEP`` tags, in name order."""
    return tuple(sorted((key.removeprefix(STEP_TAG), value) for key, value in tags.items() if key.startswith(STEP_TAG)))


def check_documents(expected: Mapping[str, str], read: Callable[[str], bytes | None]) -> tuple[DocumentCheck, ...]:
    """Hash what ``read(name)`` returns for each named document (None: the document is gone)."""
    checks = []
    for name in sorted(expected):
        data = read(name)
        checks.append(DocumentCheck(name, expected[name], None if data is None else sha256_digest(data)))
    return tuple(checks)


def report_for(approval: Mapping[str, Any] | None, documents: Mapping[str, bytes]) -> str | None:
    """The gate report (by document name) whose evidence digest the approval was given for."""
    if approval is None:
        return None
    for name in sorted(documents):
        if name.startswith("gate-report-") and not attached(name):
            try:
                digest = json.loads(documents[name]).get("evidence_digest")
            except (ValueError, AttributeError):
                continue
            if digest and digest == approval.get("evidence_digest"):
                return name
    return None


def parse_approval(data: bytes | None) -> Mapping[str, Any] | None:
    """The release manager's stored answer, if the run has one."""
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return {"unreadable": data[:80].decode("utf-8", "replace")}
    return value if isinstance(value, dict) else {"value": value}


def render(runs: Sequence[RunEvidence], aliases: Mapping[str, str]) -> str:
    """The audit as text: each attempt, its steps, approval and documents, and a verdict line."""
    lines: list[str] = []
    for run in sorted(runs, key=lambda r: r.started_ms):
        lines.append(f"run {run.run_id}  route {run.route}  decision {run.decision or '(none: still open?)'}")
        lines.append("  steps: " + (", ".join(f"{step}={outcome}" for step, outcome in run.steps) or "none recorded"))
        if run.approval is not None:
            answer = "approved" if run.approval.get("approve") else "rejected"
            if who := str(run.approval.get("approver") or "").strip():
                answer += f" by {who}"
            comment = run.approval.get("comment") or ""
            lines.append(f"  approval: {answer} for {run.approval.get('evidence_digest', '?')} {comment!r}".rstrip())
            bound = f"the evidence of {run.approved_report}" if run.approved_report else "NO gate report of this run"
            lines.append(f"    bound to {bound}")
        for check in run.documents:
            detail = "" if check.status == "ok" else f"  expected {check.expected}, stored {check.actual or 'nothing'}"
            lines.append(f"  {check.status:<8} {check.path}{detail}")
    for alias, version in sorted(aliases.items()):
        lines.append(f"alias {alias} -> version {version}")
    broken = [check for run in runs for check in run.documents if check.status != "ok"]
    if broken:
        lines.append(f"EVIDENCE ALTERED OR LOST: {len(broken)} document(s); the decisions above are unproven")
    else:
        documents = sum(len(run.documents) for run in runs)
        lines.append(f"evidence intact: {documents} document(s) in {len(runs)} run(s) match their recorded digests")
    return "\n".join(lines)


def audit_json(runs: Sequence[RunEvidence], aliases: Mapping[str, str]) -> dict[str, Any]:
    """The audit as JSON-ready data (each document with its status)."""

    def run_json(run: RunEvidence) -> dict[str, Any]:
        documents = [
            {"path": c.path, "expected": c.expected, "actual": c.actual, "status": c.status} for c in run.documents
        ]
        return {
            "run_id": run.run_id, "route": run.route, "candidate": run.candidate, "decision": run.decision,
            "started_ms": run.started_ms, "steps": dict(run.steps), "approval": run.approval,
            "approved_report": run.approved_report,
            "documents": documents, "intact": run.intact,
        }

    return {"runs": [run_json(run) for run in sorted(runs, key=lambda r: r.started_ms)], "aliases": dict(aliases)}
