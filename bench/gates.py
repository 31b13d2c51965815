"""Calibration of revgate's sequential gates against a naive repeated test and a fixed-horizon test.

One command: ``python bench/gates.py``. Simulates graded quality (Bernoulli per request) and log
latency for a stable and a candidate arm, looks after every batch of 100 requests per arm up to
2,000 per arm, and applies, side by side on the same simulated paths:

- revgate: the library's alpha-spending boundary and stopping rule (evaluation.sequential), with
  Bonferroni across slices, exactly as the quality gate runs them;
- naive: an unadjusted one-sided z-test at alpha after every batch, per slice (what a canary
  analysis that polls a threshold every interval does);
- fixed: one z-test at 2,000 per arm (Bonferroni across slices), looking once.

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

from evaluation import sequential

ALPHA = 0.05
HORIZON = 2000
BATCH = 100
SLICES = 12
MARGIN = 0.02  # the default policy's quality margin
LATENCY_MARGIN = math.log1p(0.10)
LATENCY_SIGMA = 0.5  # standard deviation of log latency within one request class
SEED = 20261129


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
    return {
        "fwer_12_slices": {s: float(fwer[s].mean()) for s in systems},
        "type1_one_slice": {s: float(type1[s].mean()) for s in systems},
        "power_3pt_drop_2000": {s: float(power[s].mean()) for s in systems},
        "power_3pt_drop_2000_among_12_slices": {s: float(power_12[s].mean()) for s in systems},
        "latency_shift_median_samples": {"revgate": float(np.median(shift))},
        "latency_shift_detected_by_2000": {"revgate": float(np.isfinite(shift).mean())},
        "latency_shift_median_samples_sigma_1": {"revgate": float(np.median(shift_wide))},
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
            "seed": SEED,
        },
    }


def main() -> None:
    """Run, print the table, write the JSON."""
    started = time.perf_counter()
    figures = run()
    elapsed = time.perf_counter() - started
    print(f"{'figure':42} {'revgate':>9} {'naive':>9} {'fixed':>9}")
    for name, row in figures.items():
        if name == "settings" or not isinstance(row, dict):
            continue
        cells = [f"{row[s]:9.4g}" if s in row else f"{'-':>9}" for s in ("revgate", "naive", "fixed")]
        print(f"{name:42} {' '.join(cells)}")
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
