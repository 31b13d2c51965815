"""The facts a registered model version states about the promotion that registered it.

Read from the rollout's own evidence run (its approval, its gate reports) and its spec, so the version
page says only what the evidence holds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from revgate.evaluation import plots
from revgate.evaluation.gates import Evidence, scores_by_slice
from revgate.flows.spec import PromotionSpec
from revgate.manifests.gates import GatePolicy, LatencyMetric
from revgate.registry.audit import counted_approvals, parse_approval
from revgate.registry.auditor_view import VersionFacts
from revgate.registry.ledger import EvidenceLedger, EvidenceRun

log = logging.getLogger(__name__)


def signer_of(spec: PromotionSpec) -> str:
    """Who the spec required to have signed the artifact: the identity, or the key or chain it was checked with."""
    policy = spec.signature
    if policy.kind == "identity":
        return f"{policy.identity} ({policy.issuer})"
    return f"{policy.kind}:{policy.public_key or ','.join(policy.chain)}"


def approver_of(
    spec: PromotionSpec, approval: dict[str, object] | None, signer: dict[str, object] | None = None
) -> str:
    """The person the stored answer names (and the key that signed it), or how the rollout was approved without one."""
    if approval is not None:
        for key in ("approver", "by", "name"):
            if str(approval.get(key) or "").strip():
                who = str(approval[key]).strip()
                return f"{who} (signed, key {signer.get('fingerprint', '?')})" if signer is not None else who
        return "release manager (unnamed)"
    return "automatic (spec.approval = auto)" if spec.approval == "auto" else "no approval step"


def version_facts(ledger: EvidenceLedger, run: EvidenceRun, spec: PromotionSpec, decision: str) -> VersionFacts:
    """The version's description and tags for a promotion decided now."""
    stored = ledger.evidence_files(run.run_id)
    counted = counted_approvals(stored)  # the latest counted answer decided the promotion
    approval = parse_approval(stored.get(counted[-1])) if counted else None
    signer = parse_approval(stored.get(f"{counted[-1]}-signer")) if counted else None
    revision = json.loads(stored["service-revision"]) if "service-revision" in stored else {}
    manifest = spec.candidate_manifest or str(revision.get("artifact", {}).get("digest", ""))
    return VersionFacts(
        decision=decision, decided_at=datetime.now(UTC).isoformat(timespec="seconds"),
        approver=approver_of(spec, dict(approval) if approval is not None else None,
                             dict(signer) if signer is not None else None),
        signer=signer_of(spec),
        manifest_digest=manifest, run_id=run.run_id, experiment_id=run.experiment_id,
        stages=ledger.stage_summaries(run.run_id),
    )


def plots_folder(spec: PromotionSpec, stage: str) -> Path:
    """Where a stage's figures wait between the analysis that draws them and the report that logs them."""
    return Path(spec.evidence_root) / "plots" / spec.route / stage


def plot_stage(spec: PromotionSpec, stage: str, proof: Evidence) -> list[Path]:
    """The stage's figures: quality per slice for both arms, latency CDFs, the sequential statistic of the
    worst slice against its boundary. A figure that cannot be drawn is logged and left out, never a failure."""
    folder = plots_folder(spec, stage)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()  # a rerun of the stage: only this analysis's figures
    policy = spec.gate_policy
    drawings: list[tuple[str, Callable[[Path], Path]]] = [
        (f"{stage}-quality-per-slice.png", partial(plots.quality_per_slice, proof, policy))]
    drawings += [(f"{stage}-{metric}-cdf.png", partial(_cdf, proof, metric)) for metric in policy.latency_metrics]
    if (worst := _worst_slice(proof, policy)) is not None:
        drawings.append((f"{stage}-sequential-{_safe(worst)}.png",
                         partial(plots.sequential_statistic, proof, policy, worst)))
    drawn = []
    for name, draw in drawings:
        try:
            drawn.append(draw(folder / name))
        except Exception:
            log.exception("could not draw %s", name)
    return drawn


def log_stage_plots(ledger: EvidenceLedger, run: EvidenceRun, spec: PromotionSpec, stage: str) -> None:
    """Attach the stage's figures to the evidence run, each digest-tagged so the audit checks it."""
    for path in sorted(plots_folder(spec, stage).glob("*.png")):
        ledger.log_attachment(run, path)


def _cdf(proof: Evidence, metric: LatencyMetric, path: Path) -> Path:
    return plots.latency_cdf(proof, metric, path)


def _worst_slice(proof: Evidence, policy: GatePolicy) -> str | None:
    """The slice where the candidate scores furthest below stable (the one a reader looks at first)."""
    stable = scores_by_slice(proof.stable, proof.stable_scores, policy.slice_keys)
    candidate = scores_by_slice(proof.candidate, proof.candidate_scores, policy.slice_keys)
    gaps = {name: _mean(stable[name]) - _mean(candidate[name]) for name in set(stable) & set(candidate)
            if stable[name] and candidate[name]}
    return max(sorted(gaps), key=gaps.__getitem__) if gaps else None


def _mean(pairs: list[tuple[Any, float]]) -> float:
    return sum(value for _, value in pairs) / len(pairs)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
