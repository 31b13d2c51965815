"""Figures for the evidence trail (matplotlib, Agg backend, PNG files written atomically).

- quality per slice with confidence-sequence intervals for both arms;
- latency CDFs of both arms from merged samples;
- the sequential statistic of one slice over its looks, against the boundary.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: figures are files for the evidence trail, never windows

import matplotlib.pyplot as plt
import numpy as np

from revgate.evaluation import metrics, sequential
from revgate.evaluation.gates import ArmSeries, Evidence, QualityGate, scores_by_slice
from revgate.manifests.gates import GatePolicy, LatencyMetric


def _save(figure: Any, path: Path) -> Path:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    figure.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(figure)
    tmp.replace(path)
    return path


def _interval(values: list[float], alpha: float) -> tuple[float, float, float]:
    if not values:
        return float("nan"), 0.0, 1.0
    lower, upper = sequential.bernoulli_confidence_sequence(round(sum(values)), len(values), alpha)
    return sum(values) / len(values), lower, upper


def quality_per_slice(evidence: Evidence, policy: GatePolicy, path: Path) -> Path:
    """Mean graded score per slice for stable and candidate, with intervals at the per-slice alpha."""
    stable = scores_by_slice(evidence.stable, evidence.stable_scores, policy.slice_keys)
    candidate = scores_by_slice(evidence.candidate, evidence.candidate_scores, policy.slice_keys)
    names = sorted(set(stable) | set(candidate))
    alpha = float(policy.alpha) / max(len(names), 1)
    figure, axes = plt.subplots(figsize=(max(5.0, 1.2 * len(names)), 3.6))
    for offset, (label, table) in zip((-0.15, 0.15), (("stable", stable), ("candidate", candidate)), strict=True):
        rows = [_interval([v for _, v in table.get(n, [])], alpha) for n in names]
        means = np.array([r[0] for r in rows])
        errors = np.array(
            [[m - r[1] for m, r in zip(means, rows, strict=True)], [r[2] - m for m, r in zip(means, rows, strict=True)]]
        )
        axes.errorbar(
            np.arange(len(names)) + offset, means, yerr=np.nan_to_num(errors), fmt="o", capsize=3, label=label
        )
    axes.set_xticks(range(len(names)), names, rotation=30, ha="right")
    axes.set_ylabel("graded score")
    axes.set_title("Quality per slice (confidence-sequence intervals)")
    axes.legend()
    return _save(figure, path)


def latency_cdf(evidence: Evidence, metric: LatencyMetric, path: Path) -> Path:
    """Empirical CDFs of one latency metric for both arms (merged samples, ms, log scale)."""
    figure, axes = plt.subplots(figsize=(5.5, 3.6))
    for label, records in (("stable", evidence.stable), ("candidate", evidence.candidate)):
        values = np.sort(metrics.latencies_ms(records, metric))
        if values.size:
            axes.step(
                values, np.arange(1, values.size + 1) / values.size, where="post", label=f"{label} (n={values.size})"
            )
    axes.set_xscale("log")
    axes.set_xlabel(f"{metric.upper()} (ms)")
    axes.set_ylabel("fraction of requests")
    axes.set_title(f"{metric.upper()} distribution")
    axes.legend()
    return _save(figure, path)


def sequential_statistic(evidence: Evidence, policy: GatePolicy, slice_name: str, path: Path) -> Path:
    """z statistic of one slice's quality comparison at each look, against the spending boundary."""
    stable = ArmSeries.of(
        scores_by_slice(evidence.stable, evidence.stable_scores, policy.slice_keys).get(slice_name, [])
    )
    candidate = ArmSeries.of(
        scores_by_slice(evidence.candidate, evidence.candidate_scores, policy.slice_keys).get(slice_name, [])
    )
    slices = len(set(scores_by_slice(evidence.stable, evidence.stable_scores, policy.slice_keys)) | {slice_name})
    decision = QualityGate(policy).decision(stable, candidate, float(policy.alpha) / slices)
    looks = decision.looks
    figure, axes = plt.subplots(figsize=(5.5, 3.6))
    sizes = [lk.samples for lk in looks]
    axes.plot(sizes, [lk.estimate / lk.standard_error for lk in looks], "o-", label="z (candidate worse)")
    axes.plot(sizes, [min(lk.boundary, 10.0) for lk in looks], "r--", label="fail boundary")
    # Passing means the upper interval end is below the margin: z <= margin / se - boundary.
    margin = float(policy.quality_margin)
    passing = [max(margin / lk.standard_error - lk.boundary, -10.0) for lk in looks]
    axes.plot(sizes, passing, "g--", label="pass boundary")
    axes.axhline(0.0, color="grey", linewidth=0.8)
    axes.set_xlabel("samples per arm")
    axes.set_ylabel("z")
    axes.set_title(f"{slice_name}: {decision.verdict}")
    axes.legend()
    return _save(figure, path)
