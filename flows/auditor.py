"""The facts a registered model version states about the promotion that registered it.

Read from the rollout's own evidence run (its approval, its gate reports) and its spec, so the version
page says only what the evidence holds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from flows.spec import PromotionSpec
from registry.audit import parse_approval
from registry.auditor_view import VersionFacts
from registry.ledger import EvidenceLedger, EvidenceRun


def signer_of(spec: PromotionSpec) -> str:
    """Who the spec required to have signed the artifact: the identity, or the key or chain it was checked with."""
    policy = spec.signature
    if policy.kind == "identity":
        return f"{policy.identity} ({policy.issuer})"
    return f"{policy.kind}:{policy.public_key or ','.join(policy.chain)}"


def approver_of(spec: PromotionSpec, approval: dict[str, object] | None) -> str:
    """The person the stored answer names, or how the rollout was approved without one."""
    if approval is not None:
        for key in ("approver", "by", "name"):
            if approval.get(key):
                return str(approval[key])
        return "release manager (unnamed)"
    return "automatic (spec.approval = auto)" if spec.approval == "auto" else "no approval step"


def version_facts(ledger: EvidenceLedger, run: EvidenceRun, spec: PromotionSpec, decision: str) -> VersionFacts:
    """The version's description and tags for a promotion decided now."""
    stored = ledger.evidence_files(run.run_id)
    approval = parse_approval(stored.get("approval"))
    revision = json.loads(stored["service-revision"]) if "service-revision" in stored else {}
    manifest = spec.candidate_manifest or str(revision.get("artifact", {}).get("digest", ""))
    return VersionFacts(
        decision=decision, decided_at=datetime.now(UTC).isoformat(timespec="seconds"),
        approver=approver_of(spec, dict(approval) if approval is not None else None), signer=signer_of(spec),
        manifest_digest=manifest, run_id=run.run_id, experiment_id=run.experiment_id,
        stages=ledger.stage_summaries(run.run_id),
    )
