"""The rollout's signed release decision: built from what the rollout logged, signed with the controller's key,
its digest written into the deciding route generation and its envelope logged in the evidence run.

What the statement says is ``promotion.attestation``'s; here are the key, the run and the clock. The
gate reports are the ones this rollout published (their digests as it logged them), the approvals the
counted answers its run holds, each with the time the rollout counted it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from revgate.flows.spec import PromotionSpec
from revgate.manifests.canonical import sha256_digest
from revgate.promotion.machine import ApprovalGiven, RolloutState
from revgate.registry.attestation import (
    ATTESTATION,
    ApprovalEntry,
    Digested,
    ReleaseDecision,
    statement_bytes,
    statement_digest,
)
from revgate.registry.audit import counted_approvals, recorded_digests
from revgate.registry.ledger import EvidenceLedger, EvidenceRun
from revgate.registry.signing import ControllerKey, load_controller_key, sign_statement

log = logging.getLogger(__name__)
ATTESTATION_TAG = "revgate.attestation"  # the latest signed decision's digest, to find the run by it


def controller_key(spec: PromotionSpec) -> ControllerKey | None:
    """The controller's signing key, or None when the site configures none (decisions are then unsigned)."""
    return load_controller_key(Path(spec.controller_key_file)) if spec.controller_key_file else None


@dataclass(frozen=True, slots=True)
class Signed:
    """A signed decision not yet committed: its statement's digest and its envelope (a Sigstore bundle)."""

    digest: str
    envelope: str
    decision: ReleaseDecision


class Attestor:
    """What a rollout's decision is signed over, noted as the rollout goes, and the signing and logging of it."""

    def __init__(self, spec: PromotionSpec, ledger: EvidenceLedger, run: EvidenceRun, key: ControllerKey | None):
        self.spec, self.ledger, self.run, self.key = spec, ledger, run, key
        self.reports: list[Digested] = []
        self.answers: list[tuple[str, bool, str]] = []  # (by, approved, when) of each counted answer, in order

    def note_report(self, name: str, digest: str, markdown: str) -> None:
        """A gate report the rollout published: its JSON's digest and its readable markdown's."""
        self.reports += [Digested(name, digest), Digested(f"{name}.md", sha256_digest(markdown.encode()))]

    def note_answer(self, given: ApprovalGiven) -> None:
        """An answer that counted (a person's: an automatic approval or a timeout leaves no answer in the run)."""
        if given.by not in ("auto", "timeout"):
            self.answers.append((given.by, given.approved, datetime.now(UTC).isoformat(timespec="seconds")))

    def approvals(self) -> tuple[ApprovalEntry, ...]:
        """The counted answers the run holds, by evidence name, with their digests as logged."""
        digests = recorded_digests(self.ledger.client.get_run(self.run.run_id).data.tags)
        return tuple(ApprovalEntry(name, digests[name], by, approved, at, digests.get(f"{name}-signature", ""))
                     for name, (by, approved, at) in zip(counted_approvals(digests), self.answers, strict=False))

    def sign(self, state: RolloutState, generation: int, *, candidate: str, stable: str,
             flow_run_id: str) -> Signed | None:
        """The decision ``state`` states, signed for route generation ``generation``; None without a key."""
        if self.key is None:
            return None
        decision = ReleaseDecision(
            route=self.spec.route, generation=generation, candidate=candidate, stable=stable,
            evidence_digest=state.evidence_digest, gate_reports=tuple(self.reports), approvals=self.approvals(),
            decision=state.status, reason=state.reason, evidence_run=self.run.run_id, flow_run_id=flow_run_id,
            decided_at=datetime.now(UTC).isoformat(timespec="seconds"))
        payload = statement_bytes(decision)
        return Signed(statement_digest(payload), sign_statement(payload, self.key), decision)

    def record(self, signed: Signed | None) -> None:
        """The envelope of a decision the route committed, in the evidence run (digest-tagged like any document);
        a site without a controller key is said to record its decisions unsigned."""
        if signed is None:
            self.ledger.log_step(self.run, "attestation", "unsigned: the site configures no controller_key_file")
            return
        name = self.ledger.log_json_new(self.run, ATTESTATION, json.loads(signed.envelope), plain_first=True)
        self.ledger.tag(self.run, ATTESTATION_TAG, signed.digest)
        assert self.key is not None
        outcome = (f"{signed.decision.decision} signed as {signed.digest} (evidence/{name}.json) with controller key "
                   f"{self.key.fingerprint}, at route generation {signed.decision.generation}")
        self.ledger.log_step(self.run, "attestation", outcome)
        log.info("release attestation: %s", outcome)
