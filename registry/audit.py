"""An auditor's check of a revision's evidence: every document a promotion run names by digest is
present, and its bytes hash to that digest.

Pure: the ledger fetches tags and bytes, this module judges and renders. A decision whose evidence
was altered or lost after the fact is unproven, whatever the run's tags say.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from revgate.manifests.canonical import sha256_digest
from revgate.manifests.route import RouteSnapshot
from revgate.registry.attestation import ReleaseDecision, attested_at, history_problem, unheld_attestations

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
class AttestationCheck:
    """A signed release decision as the audit found it: what it decides, at which route generation, and what
    does not hold (empty: verified with the auditor's controller key and matching the run and the route)."""

    name: str  # its evidence name (release-attestation, release-attestation-2, ...)
    digest: str  # the signed statement's digest ("" when it could not be read)
    decision: str
    generation: int
    signer: str  # the controller key it verified with ("" when it did not)
    problems: tuple[str, ...] = ()
    signed: ReleaseDecision | None = None  # what it says, once its signature verified


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
    attestations: tuple[AttestationCheck, ...] = ()  # the signed release decisions, oldest first
    attestation_problems: tuple[str, ...] = ()  # a decision not attested, one the route records that the run lacks
    unattested: str = ""  # why the run's decision carries no signature, where the audit accepts that

    @property
    def intact(self) -> bool:
        """Every document named by digest is present and unaltered, every approval signature verifies, and every
        release decision is signed, matches the run and is recorded in the route's history."""
        signatures = (record.signature for record in self.approvals if record.signature is not None)
        return (all(check.status == "ok" for check in self.documents) and all(sig.verified for sig in signatures)
                and not self.attestation_problems and not any(check.problems for check in self.attestations))


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
        lines += attestation_lines(run)
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
    unattested = [problem for run in runs for problem in (*run.attestation_problems,
                                                          *(p for check in run.attestations for p in check.problems))]
    if unattested:
        lines.append(f"RELEASE DECISIONS THAT DO NOT VERIFY: {len(unattested)} problem(s) above; those decisions are "
                     "unproven")
    if not broken and not unsigned and not unattested:
        documents = sum(len(run.documents) for run in runs)
        lines.append(f"evidence intact: {documents} document(s) in {len(runs)} run(s) match their recorded digests")
    return "\n".join(lines)


def attestation_lines(run: RunEvidence) -> list[str]:
    """Each signed release decision: what it decides, where the route records it, and every problem found."""
    lines = []
    for check in run.attestations:
        where = f"at route generation {check.generation}" if check.generation else "at no readable generation"
        verdict = (f"signed with controller key {check.signer}: verified, matches the run and the route history"
                   if not check.problems else "DOES NOT VERIFY")
        lines.append(f"  release attestation evidence/{check.name}.json: {check.decision or '?'} {where}, "
                     f"{check.digest or 'unreadable'}")
        lines.append(f"    {verdict}")
        lines += [f"    - {problem}" for problem in check.problems]
    lines += [f"  RELEASE DECISION PROBLEM: {problem}" for problem in run.attestation_problems]
    if run.unattested:
        lines.append(f"  release decision not attested: {run.unattested}")
    return lines


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
            "attestations": [{"name": a.name, "digest": a.digest, "decision": a.decision,
                              "route_generation": a.generation, "signer": a.signer, "verified": not a.problems,
                              "problems": list(a.problems)} for a in run.attestations],
            "attestation_problems": list(run.attestation_problems), "unattested": run.unattested or None,
        }

    def approval_json(record: ApprovalRecord) -> dict[str, Any]:
        signature = record.signature
        return {"name": record.name, "answer": record.answer, "report": record.report, "signed": signature is not None,
                "key_fingerprint": signature.fingerprint if signature else None,
                "signature_verified": signature.verified if signature else None,
                "signature_problem": signature.detail if signature and not signature.verified else None}

    return {"runs": [run_json(run) for run in sorted(runs, key=lambda r: r.started_ms)], "aliases": dict(aliases)}


def anchor_in_history(runs: Sequence[RunEvidence], history: Sequence[RouteSnapshot] | None,
                      store: str) -> list[RunEvidence]:
    """The runs with each signed decision held against the route's history (None: no route store was named),
    and every decision the history records for the revision that none of its runs holds."""
    if history is None:
        missing = ("not checked against the route's history: give --routes STORE (or --site) so the audit can "
                   "see that the route recorded this decision",)
        return [replace(run, attestations=tuple(replace(check, problems=(*check.problems, *missing))
                                                if check.signed is not None else check
                                                for check in run.attestations)) for run in runs]
    generations = attested_at(history)
    anchored = []
    for run in runs:
        checks = []
        for check in run.attestations:
            where = f"the release attestation evidence/{check.name}.json of run {run.run_id}"
            problem = "" if check.signed is None else history_problem(check.signed, check.digest, generations,
                                                                       where=where, store=store)
            checks.append(replace(check, problems=(*check.problems, problem)) if problem else check)
        anchored.append(replace(run, attestations=tuple(checks)))
    held = [check.digest for run in runs for check in run.attestations if check.digest]
    candidates = sorted({run.candidate for run in runs})
    unheld = [problem for candidate in candidates
              for problem in unheld_attestations(history, candidate, held, store=store)]
    if unheld and anchored:
        latest = max(range(len(anchored)), key=lambda index: anchored[index].started_ms)
        anchored[latest] = replace(anchored[latest],
                                   attestation_problems=(*anchored[latest].attestation_problems, *unheld))
    return anchored
