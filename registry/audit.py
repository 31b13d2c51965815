"""An auditor's check of a revision's evidence: every document a promotion run names by digest is
present, and its bytes hash to that digest.

Pure: the ledger fetches tags and bytes, this module judges and renders. A decision whose evidence
was altered or lost after the fact is unproven, whatever the run's tags say.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from revgate.manifests.canonical import sha256_digest

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


COUNTED_APPROVAL = re.compile(r"^approval(?:-(\d+))?$")  # approval, approval-2, ...: the answers that counted


def counted_approvals(names: Iterable[str]) -> list[str]:
    """The evidence names of the counted answers to the approval form, in the order they came."""
    numbered = [(int(match.group(1) or 1), name) for name in names if (match := COUNTED_APPROVAL.match(name))]
    return [name for _, name in sorted(numbered)]


@dataclass(frozen=True, slots=True)
class SignatureAudit:
    """A signed approval as the audit found it: the key recorded, and whether the signature verifies now."""

    fingerprint: str  # the key's sha256, as the flow recorded it
    verified: bool  # re-verified now over the stored statement with the auditor's key, saying what the answer says
    detail: str = ""  # why it does not verify


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One counted answer: its evidence name, what it said, the gate report it is bound to, its signature."""

    name: str
    answer: Mapping[str, Any]
    report: str | None
    signature: SignatureAudit | None  # None: the answer was not signed


def statement_problem(answer: Mapping[str, Any], statement: bytes, route: str = "", flow_run_id: str = "") -> str:
    """What a signed statement says that the recorded answer (or the run: its route and Prefect flow run, where
    recorded) does not; empty when they agree."""
    try:
        said = json.loads(statement)
    except ValueError:
        return "the signed statement is not JSON"
    if not isinstance(said, dict):
        return "the signed statement is not a JSON object"
    for field in ("approve", "evidence_digest", "comment"):
        if said.get(field, "") != answer.get(field, ""):
            return f"the signed statement's {field} is not the recorded answer's"
    if str(said.get("approver", "")).strip().casefold() != str(answer.get("approver", "")).strip().casefold():
        return "the signed statement names another approver than the recorded answer"
    for field, recorded in (("route", route), ("flow_run_id", flow_run_id)):
        if recorded and str(said.get(field, "")) != recorded:
            return f"the signed statement's {field} {said.get(field, '')!r} is not the run's {recorded!r}"
    return ""


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
    approvals: tuple[ApprovalRecord, ...] = ()  # every counted answer (approval, approval-2, ...)

    @property
    def intact(self) -> bool:
        """Every document named by digest is present and unaltered, and every approval signature verifies."""
        signatures = (record.signature for record in self.approvals if record.signature is not None)
        return all(check.status == "ok" for check in self.documents) and all(sig.verified for sig in signatures)


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
        records = run.approvals or ((ApprovalRecord("approval", run.approval, run.approved_report, None),)
                                    if run.approval is not None else ())
        for record in records:
            lines += approval_lines(record)
        for check in run.documents:
            detail = "" if check.status == "ok" else f"  expected {check.expected}, stored {check.actual or 'nothing'}"
            lines.append(f"  {check.status:<8} {check.path}{detail}")
    for alias, version in sorted(aliases.items()):
        lines.append(f"alias {alias} -> version {version}")
    broken = [check for run in runs for check in run.documents if check.status != "ok"]
    unsigned = [record for run in runs for record in run.approvals
                if record.signature is not None and not record.signature.verified]
    if broken:
        lines.append(f"EVIDENCE ALTERED OR LOST: {len(broken)} document(s); the decisions above are unproven")
    if unsigned:
        lines.append(f"APPROVAL SIGNATURES THAT DO NOT VERIFY: {len(unsigned)}; those approvals are unproven")
    if not broken and not unsigned:
        documents = sum(len(run.documents) for run in runs)
        lines.append(f"evidence intact: {documents} document(s) in {len(runs)} run(s) match their recorded digests")
    return "\n".join(lines)


def approval_lines(record: ApprovalRecord) -> list[str]:
    """One counted answer: who decided what for which evidence, what it is bound to, and its signature."""
    answer = "approved" if record.answer.get("approve") else "rejected"
    if who := str(record.answer.get("approver") or "").strip():
        answer += f" by {who}"
    comment = record.answer.get("comment") or ""
    label = "approval" if record.name == "approval" else record.name
    lines = [f"  {label}: {answer} for {record.answer.get('evidence_digest', '?')} {comment!r}".rstrip()]
    bound = f"the evidence of {record.report}" if record.report else "NO gate report of this run"
    lines.append(f"    bound to {bound}")
    signature = record.signature
    if signature is None:
        lines.append("    unsigned (a name typed on the form)")
    elif signature.verified:
        lines.append(f"    signed with key {signature.fingerprint}: signature verified (re-checked now)")
    else:
        lines.append(f"    SIGNATURE DOES NOT VERIFY (key {signature.fingerprint or 'unknown'}): {signature.detail}")
    return lines


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
            "approvals": [approval_json(record) for record in run.approvals],
            "documents": documents, "intact": run.intact,
        }

    def approval_json(record: ApprovalRecord) -> dict[str, Any]:
        signature = record.signature
        return {"name": record.name, "answer": record.answer, "report": record.report, "signed": signature is not None,
                "key_fingerprint": signature.fingerprint if signature else None,
                "signature_verified": signature.verified if signature else None,
                "signature_problem": signature.detail if signature and not signature.verified else None}

    return {"runs": [run_json(run) for run in sorted(runs, key=lambda r: r.started_ms)], "aliases": dict(aliases)}
