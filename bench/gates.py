"""Calibration of revgate's sequential gates against a naive repeated test and a fixed-horizon test.

One command: ``python bench/gates.py``. Simulates graded quality (Bernoulli per request) and log
latency for a stable and a candidate arm, looks after every batch of 100 requests per arm up to
2,000 per arm, and applies, side by side on the same simulated paths:

- revgate: the library's alpha-spending boundary and stopping rule (evaluation.sequential), with
  Bonferroni across slices, exactly as the quality gate runs them;
- naive: an unadjusted one-sided z-test at alpha after every batch, per slice (what a canary
  analysis that polls a threshold every interval does);
- fixed: one z-test at 2,000 per arm (Bonferroni across slices), looking once.

Paired (shadow) figures: both revisions answer the same prompts, so each request gives a pair of
0/1 outcomes with the given marginals and a given probability that the two agree. Looking after
every batch of 50 pairs up to 600, on the same simulated pairs: the paired gate's own statistic
(evaluation.paired, discordant pairs, alpha spending, Bonferroni across slices), the two-sample
gate's statistic on the same answers (as if the pairing were unknown), and the naive and fixed
versions of the paired z-test.

Writes bench/results/gates.json.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from revgate.evaluation import paired, sequential

ALPHA = 0.05
HORIZON = 2000
BATCH = 100
SLICES = 12
MARGIN = 0.02  # the default policy's quality margin
LATENCY_MARGIN = math.log1p(0.10)
LATENCY_SIGMA = 0.5  # standard deviation of log latency within one request class
SEED = 20261129
PAIRED_HORIZON = 600
PAIRED_BATCH = 50
PAIRED_LATENCY_TOLERANCE = math.log1p(0.6)  # a paired latency margin of 0.6 (1.6x), above 1.5x scheduling noise


def cumulative_successes(
    rng: np.random.Generator, sims: int, slices: int, p: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Successes at each look, shape (sims, slices, looks)."""
    looks = HORIZON // BATCH
    return np.cumsum(rng.binomial(BATCH, p[None, :, None], size=(sims, slices, looks)), axis=-1).astype(float)


def proportion_gap(
    s_stable: NDArray[np.float64], s_cand: NDArray[np.float64], n: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Vectorised twin of evaluation.gates.proportion_gap (Agresti-Caffo)."""
    m_s, m_c = (s_stable + 1) / (n + 2), (s_cand + 1) / (n + 2)
    return m_s - m_c, np.sqrt(m_s * (1 - m_s) / (n + 2) + m_c * (1 - m_c) / (n + 2))


def quality_decisions(
    rng: np.random.Generator, sims: int, p_stable: NDArray[np.float64], p_cand: NDArray[np.float64]
) -> dict[str, NDArray[np.bool_]]:
    """For each system, whether any slice was declared worse; shape (sims,)."""
    slices = p_stable.size
    n = np.arange(1, HORIZON // BATCH + 1, dtype=float) * BATCH
    estimate, se = proportion_gap(
        cumulative_successes(rng, sims, slices, p_stable), cumulative_successes(rng, sims, slices, p_cand), n
    )
    z = estimate / se
    per_slice_alpha = ALPHA / slices
    bounds = np.array(sequential.spending_boundary(per_slice_alpha, sequential.look_fractions(HORIZON, BATCH)))
    code, _ = sequential.verdicts(estimate, se, bounds, MARGIN)
    return {
        "revgate": (code == sequential.WORSE).any(axis=-1),
        "naive": (z >= stats.norm.isf(ALPHA)).any(axis=-1).any(axis=-1),
        "fixed": (z[..., -1] >= stats.norm.isf(per_slice_alpha)).any(axis=-1),
    }


def latency_detection_samples(
    rng: np.random.Generator, sims: int, shift: float, sigma: float, alpha: float
) -> NDArray[np.float64]:
    """Samples per arm at which revgate's latency gate declares the candidate slower (inf if never)."""
    stable = rng.normal(0.0, sigma, size=(sims, HORIZON))
    cand = rng.normal(shift, sigma, size=(sims, HORIZON))
    idx = np.arange(BATCH, HORIZON + 1, BATCH)

    def running(x: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        s1, s2 = np.cumsum(x, axis=1)[:, idx - 1], np.cumsum(x * x, axis=1)[:, idx - 1]
        mean = s1 / idx
        return mean, (s2 - idx * mean**2) / (idx - 1)

    m_c, v_c = running(cand)
    m_s, v_s = running(stable)
    bounds = np.array(sequential.spending_boundary(alpha, sequential.look_fractions(HORIZON, BATCH)))
    code, first = sequential.verdicts(m_c - m_s, np.sqrt(v_c / idx + v_s / idx), bounds, LATENCY_MARGIN)
    return np.where(code == sequential.WORSE, idx[np.maximum(first, 0)], np.inf).astype(float)


def cell_probabilities(p_stable: float, p_candidate: float, agree: float) -> NDArray[np.float64]:
    """P(both right), P(candidate lost), P(candidate won), P(both wrong) for the given marginals and agreement."""
    lost = (1.0 - agree + p_stable - p_candidate) / 2.0
    won = (1.0 - agree - p_stable + p_candidate) / 2.0
    cells = np.array([p_stable - lost, lost, won, 1.0 - p_stable - won], dtype=float)
    if (cells < -1e-12).any():
        raise ValueError(f"no joint distribution has marginals {p_stable}, {p_candidate} and agreement {agree}")
    clipped: NDArray[np.float64] = np.clip(cells, 0.0, 1.0)
    return clipped


def paired_counts(rng: np.random.Generator, sims: int, cells: NDArray[np.float64]) -> NDArray[np.float64]:
    """Cumulative pair counts per cell at each look, shape (sims, slices, looks, 4)."""
    looks = PAIRED_HORIZON // PAIRED_BATCH
    per_slice = [rng.multinomial(PAIRED_BATCH, c, size=(sims, looks)) for c in cells]
    return np.cumsum(np.stack(per_slice, axis=1), axis=2).astype(float)


def paired_decisions(
    rng: np.random.Generator, sims: int, p_stable: NDArray[np.float64], p_cand: NDArray[np.float64], agree: float
) -> dict[str, NDArray[np.bool_]]:
    """Per system, whether any slice was declared worse (``within`` for the false-pass figure); shape (sims,)."""
    cells = np.array([cell_probabilities(s, c, agree) for s, c in zip(p_stable, p_cand, strict=True)])
    counts = paired_counts(rng, sims, cells)
    both, lost, won = counts[..., 0], counts[..., 1], counts[..., 2]
    n = np.arange(1, PAIRED_HORIZON // PAIRED_BATCH + 1, dtype=float) * PAIRED_BATCH
    per_slice_alpha = ALPHA / p_stable.size
    bounds = np.array(paired.LookPlan(per_slice_alpha, PAIRED_HORIZON, PAIRED_BATCH).bounds())
    z_worse, z_within = paired.quality_z(lost, won, n, MARGIN)
    code, _ = paired.score_verdicts(z_worse, z_within, bounds)
    u_estimate, u_se = proportion_gap(both + lost, both + won, n)  # the same answers, pairing ignored
    u_code, _ = sequential.verdicts(u_estimate, u_se, bounds, MARGIN)
    z = z_worse
    return {
        "paired": (code == sequential.WORSE).any(axis=-1),
        "paired_within": (code == sequential.WITHIN).any(axis=-1),
        "unpaired": (u_code == sequential.WORSE).any(axis=-1),
        "naive": (z >= stats.norm.isf(ALPHA)).any(axis=-1).any(axis=-1),
        "fixed": (z[..., -1] >= stats.norm.isf(per_slice_alpha)).any(axis=-1),
    }


def paired_figures(rng: np.random.Generator, sims: int) -> dict[str, dict[str, float]]:
    """The paired figures, each beside the naive and fixed paired tests and the two-sample test."""
    one, drop = np.array([0.90]), np.array([0.87])
    at_95 = paired_decisions(rng, sims, one, drop, 0.95)
    at_90 = paired_decisions(rng, sims, one, drop, 0.90)
    null_12 = np.linspace(0.60, 0.95, SLICES)
    fwer = paired_decisions(rng, sims, null_12, null_12, 0.95)
    fwer_90 = paired_decisions(rng, sims, null_12, null_12, 0.90)
    at_margin = paired_decisions(rng, sims, one, one - MARGIN, 0.95)

    def row(result: dict[str, NDArray[np.bool_]], key: str = "paired") -> dict[str, float]:
        return {
            "revgate": float(result[key].mean()),
            "naive": float(result["naive"].mean()),
            "fixed": float(result["fixed"].mean()),
        }

    return {
        "paired_power_3pt_drop_600": row(at_95),
        "paired_power_3pt_drop_600_agree_90": row(at_90),
        "unpaired_power_3pt_drop_600": {"revgate": float(at_95["unpaired"].mean())},
        "unpaired_power_3pt_drop_600_agree_90": {"revgate": float(at_90["unpaired"].mean())},
        "paired_fwer_12_slices": row(fwer),
        "paired_fwer_12_slices_agree_90": row(fwer_90),
        "paired_false_pass_at_margin": {"revgate": float(at_margin["paired_within"].mean())},
    }


def paired_latency_verdicts(
    rng: np.random.Generator, sims: int, ratio: float, alpha: float
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """The paired latency gate on simulated log ratios: verdict codes and pairs at the decision (inf if none)."""
    d = rng.normal(math.log(ratio), LATENCY_SIGMA, size=(sims, PAIRED_HORIZON))
    plan = paired.LookPlan(alpha, PAIRED_HORIZON, PAIRED_BATCH)
    sizes = np.array(plan.sizes())
    total, total_sq = np.cumsum(d, axis=1)[:, sizes - 1], np.cumsum(d * d, axis=1)[:, sizes - 1]
    estimate, se = paired.latency_gap(total, total_sq, sizes.astype(float))
    code, first = sequential.verdicts(estimate - PAIRED_LATENCY_TOLERANCE, se, np.array(plan.bounds()), 0.0)
    return code, np.where(first >= 0, sizes[np.maximum(first, 0)], np.inf).astype(float)


def paired_latency_figures(rng: np.random.Generator, sims: int) -> dict[str, dict[str, float]]:
    """A 3.5x slowdown, a 1.5x scheduling bias and a ratio exactly at the margin, per metric's alpha."""
    alpha = ALPHA / 2  # two latency metrics share the alpha
    slow, slow_at = paired_latency_verdicts(rng, sims, 3.5, alpha)
    bias, _ = paired_latency_verdicts(rng, sims, 1.5, alpha)
    edge, _ = paired_latency_verdicts(rng, sims, math.exp(PAIRED_LATENCY_TOLERANCE), alpha)
    return {
        "paired_latency_3_5x_median_pairs": {"revgate": float(np.median(slow_at))},
        "paired_latency_3_5x_caught_by_600": {"revgate": float((slow == sequential.WORSE).mean())},
        "paired_latency_1_5x_bias_failed": {"revgate": float((bias == sequential.WORSE).mean())},
        "paired_latency_at_margin_failed": {"revgate": float((edge == sequential.WORSE).mean())},
    }


def run() -> dict[str, object]:
    """Every figure, side by side."""
    rng = np.random.default_rng(SEED)
    sims = 20000
    null_12 = np.linspace(0.60, 0.95, SLICES)  # slices differ in base rate; no true difference
    fwer = quality_decisions(rng, sims, null_12, null_12)
    one = np.array([0.90])
    type1 = quality_decisions(rng, sims, one, one)
    power = quality_decisions(rng, sims, one, np.array([0.87]))
    base_12, drop_12 = null_12.copy(), null_12.copy()
    base_12[-2], drop_12[-2] = 0.90, 0.87  # one slice drops three points, eleven stay equal
    power_12 = quality_decisions(rng, sims // 4, base_12, drop_12)
    latency_alpha = ALPHA / 2  # the default policy gates TTFT and E2E
    shift = latency_detection_samples(rng, 4000, math.log(1.2), LATENCY_SIGMA, latency_alpha)
    shift_wide = latency_detection_samples(rng, 4000, math.log(1.2), 2 * LATENCY_SIGMA, latency_alpha)
    systems = ("revgate", "naive", "fixed")
    paired_rows = paired_figures(rng, sims) | paired_latency_figures(rng, 4000)
    return {
        "fwer_12_slices": {s: float(fwer[s].mean()) for s in systems},
        "type1_one_slice": {s: float(type1[s].mean()) for s in systems},
        "power_3pt_drop_2000": {s: float(power[s].mean()) for s in systems},
        "power_3pt_drop_2000_among_12_slices": {s: float(power_12[s].mean()) for s in systems},
        "latency_shift_median_samples": {"revgate": float(np.median(shift))},
        "latency_shift_detected_by_2000": {"revgate": float(np.isfinite(shift).mean())},
        "latency_shift_median_samples_sigma_1": {"revgate": float(np.median(shift_wide))},
        **paired_rows,
        "settings": {
            "alpha": ALPHA,
            "horizon_per_arm": HORIZON,
            "look_every": BATCH,
            "slices": SLICES,
            "quality_margin": MARGIN,
            "latency_log_sigma": LATENCY_SIGMA,
            "latency_alpha": latency_alpha,
            "quality_simulations": sims,
            "latency_simulations": 4000,
            "paired_horizon_pairs": PAIRED_HORIZON,
            "paired_look_every": PAIRED_BATCH,
            "paired_simulations": sims,
            "paired_latency_margin": 0.6,
            "paired_latency_simulations": 4000,
            "seed": SEED,
        },
    }


def main() -> None:
    """Run, print the table, write the JSON."""
    started = time.perf_counter()
    figures = run()
    elapsed = time.perf_counter() - started
    print(f"{'figure':44} {'revgate':>9} {'naive':>9} {'fixed':>9}")
    for name, row in figures.items():
        if name == "settings" or not isinstance(row, dict):
            continue
        cells = [f"{row[s]:9.4g}" if s in row else f"{'-':>9}" for s in ("revgate", "naive", "fixed")]
        print(f"{name:44} {' '.join(cells)}")
    print(f"({elapsed:.1f} s)")
    result = {
        **figures,
        "command": "python bench/gates.py",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, py {platform.python_version()}",
        "seconds": round(elapsed, 1),
    }
    out = Path(__file__).resolve().parent / "results" / "gates.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)


if __name__ == "__main__":
    main()
