"""The release decision a rollout signs, and the audit's check of it against the run and the route's history.

At each decision (promoted; rolled back by a failing gate, an inconclusive rule, a rejection, an
abort, a revert in the rollback window) the controller signs an in-toto Statement (v1) whose subject
is the candidate revision (its fingerprint) and whose predicate (``PREDICATE_TYPE``) says what the
decision was made from: the route and the generation the decision is written at, both revisions,
the evidence digest approvals are bound to, the digest of every gate report, every counted approval
(and its signature's digest), the decision and its reason. The statement's digest goes into that
route generation (``RouteSnapshot.decision_attestation``), the signed envelope into the evidence run.

The generation is the one the decision's write commits: the controller writes with compare-and-swap
on top of the generation it last wrote, so it knows the next one before it writes, and a write that
loses the race is never committed (its statement is never logged).

Pure: signing and verifying the envelope, and reading the run and the route store, are the callers'.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from revgate.manifests.canonical import canonical_json, sha256_digest
from revgate.manifests.errors import RevgateError
from revgate.manifests.route import RouteSnapshot

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://revgate.dev/release-decision/v1"
SUBJECT_NAME = "service-revision"  # the candidate, named by its fingerprint (the ServiceRevision's digest)
DECISIONS = ("promoted", "rolled_back")
ATTESTATION = "release-attestation"  # the run's evidence name of the first signed envelope (then -2, -3, ...)


class AttestationUnreadable(RevgateError):
    """A signed statement that is not a release decision revgate can read."""


@dataclass(frozen=True, slots=True)
class Digested:
    """An evidence document of the run by name, and the digest of its bytes when the decision was signed."""

    name: str
    digest: str


@dataclass(frozen=True, slots=True)
class ApprovalEntry:
    """A counted answer to an approval form: who, when (as the controller counted it), and its documents."""

    document: str  # its evidence name: approval, approval-2, ...
    digest: str  # the digest of that document
    approver: str
    approve: bool
    at: str  # ISO 8601, UTC
    signature_digest: str = ""  # the digest of its signature document (``NAME-signature``); empty: unsigned


@dataclass(frozen=True, slots=True)
class ReleaseDecision:
    """The predicate of the signed release decision."""

    route: str
    generation: int  # the route generation the decision is written at
    candidate: str
    stable: str
    evidence_digest: str  # the evidence the approvals are bound to (the latest gate report's)
    gate_reports: tuple[Digested, ...]
    approvals: tuple[ApprovalEntry, ...]
    decision: str  # promoted or rolled_back
    reason: str
    evidence_run: str  # the MLflow run the envelope is logged in
    flow_run_id: str  # the Prefect flow run that decided ("" outside one)
    decided_at: str


def statement(decision: ReleaseDecision) -> dict[str, Any]:
    """The in-toto Statement v1 of ``decision``."""
    predicate = {
        "route": decision.route, "route_generation": decision.generation,
        "candidate": decision.candidate, "stable": decision.stable, "evidence_digest": decision.evidence_digest,
        "gate_reports": [{"name": r.name, "digest": r.digest} for r in decision.gate_reports],
        "approvals": [{"document": a.document, "digest": a.digest, "approver": a.approver, "approve": a.approve,
                       "at": a.at, "signature_digest": a.signature_digest} for a in decision.approvals],
        "decision": decision.decision, "reason": decision.reason, "evidence_run": decision.evidence_run,
        "flow_run_id": decision.flow_run_id, "decided_at": decision.decided_at,
    }
    subject = [{"name": SUBJECT_NAME, "digest": {"sha256": decision.candidate.removeprefix("sha256:")}}]
    return {"_type": STATEMENT_TYPE, "subject": subject, "predicateType": PREDICATE_TYPE, "predicate": predicate}


def statement_bytes(decision: ReleaseDecision) -> bytes:
    """The statement's canonical JSON: the bytes the controller signs and the route's history names by digest."""
    return canonical_json(statement(decision))


def statement_digest(payload: bytes) -> str:
    """``sha256:HEX`` of a signed statement's bytes: what the route generation records."""
    return sha256_digest(payload)


def parse_statement(payload: bytes, *, where: str) -> ReleaseDecision:
    """The release decision a verified statement holds; AttestationUnreadable when it is another statement."""
    try:
        said = json.loads(payload)
        if said.get("_type") != STATEMENT_TYPE or said.get("predicateType") != PREDICATE_TYPE:
            raise ValueError(f"not a {PREDICATE_TYPE} statement")
        body = said["predicate"]
        decision = ReleaseDecision(
            route=str(body["route"]), generation=int(body["route_generation"]), candidate=str(body["candidate"]),
            stable=str(body["stable"]), evidence_digest=str(body["evidence_digest"]),
            gate_reports=tuple(Digested(str(r["name"]), str(r["digest"])) for r in body["gate_reports"]),
            approvals=tuple(ApprovalEntry(str(a["document"]), str(a["digest"]), str(a["approver"]), bool(a["approve"]),
                                          str(a["at"]), str(a.get("signature_digest", "")))
                            for a in body["approvals"]),
            decision=str(body["decision"]), reason=str(body["reason"]), evidence_run=str(body["evidence_run"]),
            flow_run_id=str(body.get("flow_run_id", "")), decided_at=str(body.get("decided_at", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise AttestationUnreadable(f"the signed statement is not a release decision ({error})", where=where,
                                    fix="Obtain the original attestation; the decision is unproven.") from None
    subject = said.get("subject") or [{}]
    if subject[0].get("digest", {}).get("sha256") != decision.candidate.removeprefix("sha256:"):
        raise AttestationUnreadable("the statement's subject is not the candidate its predicate names", where=where,
                                    fix="Obtain the original attestation; the decision is unproven.")
    return decision


# ---------------------------------------------------------------------------------------------
# The audit: the signed predicate against what the run holds now, and against the route's history


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What an evidence run holds now, as the audit read it (none of it trusted)."""

    run_id: str
    route: str
    candidate: str
    flow_run_id: str
    decision: str  # the run's decision tag
    stored: Mapping[str, str]  # evidence name -> sha256 of the bytes stored now (every file, tagged or not)
    report_evidence: Mapping[str, str]  # gate report (JSON) name -> the evidence digest it states
    counted: tuple[str, ...]  # the counted answers' evidence names (approval, approval-2, ...)


ATTESTATION_NAME = re.compile(rf"^{ATTESTATION}(?:-(\d+))?$")


def attestation_names(names: Iterable[str]) -> list[str]:
    """The evidence names of a run's signed decisions, in the order they were made."""
    numbered = [(int(match.group(1) or 1), name) for name in names if (match := ATTESTATION_NAME.match(name))]
    return [name for _, name in sorted(numbered)]


def is_gate_report(name: str) -> bool:
    """Whether an evidence name is a gate report (its JSON or its readable markdown)."""
    return name.startswith("gate-report-")


def predicate_problems(decision: ReleaseDecision, run: RunFacts, *, where: str, final: bool) -> list[str]:
    """What the signed decision says that the run does not hold now; each names what, where, and what to do.

    ``final``: the run's last attestation, which must also cover every gate report and counted approval
    the run holds and state the run's decision.
    """
    unproven = "The decision is unproven"
    problems = []
    for label, said, found in (("route", decision.route, run.route), ("candidate", decision.candidate, run.candidate),
                               ("evidence run", decision.evidence_run, run.run_id)):
        if said != found:
            problems.append(f"{where} signs a decision for {label} {said}, but run {run.run_id} is for {found}: it "
                            f"was copied from another run. {unproven}; find the run it names with `revgate evidence`.")
    if decision.flow_run_id and run.flow_run_id and decision.flow_run_id != run.flow_run_id:
        problems.append(f"{where} was signed by flow run {decision.flow_run_id}, but run {run.run_id} records flow "
                        f"run {run.flow_run_id}. {unproven}; check the run's prefect_flow_run_id tag.")
    signed = [(f"gate report evidence/{r.name}", r.name, r.digest) for r in decision.gate_reports]
    for approval in decision.approvals:
        signed.append((f"approval evidence/{approval.document}", approval.document, approval.digest))
        if approval.signature_digest:
            signed.append((f"approval signature evidence/{approval.document}-signature",
                           f"{approval.document}-signature", approval.signature_digest))
    problems += [problem for label, name, digest in signed
                 if (problem := document_problem(label, run.stored.get(name), digest, run.run_id, where))]
    if final:
        problems += coverage_problems(decision, run, where)
    reports = [r.name for r in decision.gate_reports if r.name in run.report_evidence]
    if reports and run.report_evidence[max(reports)] != decision.evidence_digest:
        problems.append(f"{where} signs evidence {decision.evidence_digest}, but the latest gate report it lists "
                        f"(evidence/{max(reports)}) states {run.report_evidence[max(reports)]}. {unproven}.")
    return problems


def document_problem(label: str, actual: str | None, signed: str, run_id: str, where: str) -> str:
    """Why a document the decision signed does not stand in the run now; empty when it does."""
    if actual is None:
        return (f"{label}, signed in {where}, is missing from run {run_id}: it was deleted after the decision. "
                "Restore it from a backup of the artifact store; until then the decision is unproven.")
    if actual != signed:
        return (f"{label} in run {run_id} hashes to {actual}, but {where} signed {signed}: it was changed after "
                "the decision (a digest tag changed with it proves nothing). Restore the original from a backup; "
                "until then the decision is unproven.")
    return ""


def coverage_problems(decision: ReleaseDecision, run: RunFacts, where: str) -> list[str]:
    """What the run holds or says beyond the last signed decision: reports or answers added after it, another
    decision."""
    problems = []
    listed = {r.name for r in decision.gate_reports}
    for name in sorted(name for name in run.stored if is_gate_report(name) and name not in listed):
        problems.append(f"gate report evidence/{name} in run {run.run_id} is not in {where}: it was added after "
                        "the decision. Remove it, or treat the run's reports as unproven.")
    answered = {a.document for a in decision.approvals}
    for name in (name for name in run.counted if name not in answered):
        problems.append(f"approval evidence/{name} in run {run.run_id} is not in {where}: it was added after the "
                        "decision. Remove it, or treat the run's approvals as unproven.")
    if run.decision != decision.decision:
        problems.append(f"run {run.run_id} is tagged decision {run.decision or '(none)'}, but {where} signs "
                        f"{decision.decision} ({decision.reason}). The signed decision stands; if another writer "
                        "changed the route afterwards (evidence/aborted.json), check it with `revgate route history`.")
    return problems


def attested_at(history: Iterable[RouteSnapshot]) -> dict[int, RouteSnapshot]:
    """Generation -> snapshot, for the snapshots of a route's history."""
    return {snapshot.generation: snapshot for snapshot in history}


def history_problem(decision: ReleaseDecision, digest: str, history: Mapping[int, RouteSnapshot], *, where: str,
                    store: str) -> str:
    """Why the route's history does not record this signed decision at its generation; empty when it does."""
    snapshot = history.get(decision.generation)
    fix = (f"The decision is unproven: compare `revgate route history {decision.route} --routes {store}` with the "
           "run, and restore the route store's history from its backup.")
    if snapshot is None:
        return f"route {decision.route} has no generation {decision.generation} in {store}, which {where} names. {fix}"
    if snapshot.decision_attestation != digest:
        return (f"route {decision.route} generation {decision.generation} in {store} records attestation "
                f"{snapshot.decision_attestation or '(none)'}, not {where}'s {digest}. {fix}")
    promoted = snapshot.stable.fingerprint == decision.candidate
    if promoted != (decision.decision == "promoted"):
        return (f"route {decision.route} generation {decision.generation} serves {snapshot.stable.short} as stable, "
                f"which is not what {where} decided ({decision.decision}). {fix}")
    return ""


def unheld_attestations(history: Sequence[RouteSnapshot], candidate: str, held: Iterable[str], *,
                        store: str) -> list[str]:
    """Decisions about ``candidate`` the route's history records by attestation that no run of it holds.

    A generation is about the candidate when it makes it stable, takes it off stable, or ends its canary
    or shadow (the generation before named it).
    """
    known, problems = set(held), []
    for before, snapshot in zip([None, *history[:-1]], history, strict=True):
        digest = snapshot.decision_attestation
        if digest is None or digest in known or not about(before, snapshot, candidate):
            continue
        problems.append(f"route {snapshot.route} generation {snapshot.generation} in {store} records release "
                        f"attestation {digest} for revision {candidate[:19]}, but no run of it holds that "
                        "attestation: it was deleted from the run. The decision is unproven: restore the run's "
                        "evidence/release-attestation document from a backup of the artifact store.")
    return problems


def about(before: RouteSnapshot | None, snapshot: RouteSnapshot, candidate: str) -> bool:
    """Whether the write from ``before`` to ``snapshot`` decided about ``candidate``: it ended the candidate's
    canary or shadow, or moved stable onto or off it."""
    if before is None:
        return snapshot.stable.fingerprint == candidate
    trying = any(target is not None and target.fingerprint == candidate for target in (before.candidate, before.shadow))
    return trying or (before.stable.fingerprint == candidate) != (snapshot.stable.fingerprint == candidate)
