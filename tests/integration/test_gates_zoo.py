"""The gates on real traffic: the reference models served by vLLM, graded against reference answers.

Quality reads the zoo's evaluation records (ZOO/eval/<revision>.jsonl: the balanced evaluation set
as greedy completions, made once per run by the session fixtures ``zoo_dir`` and ``zoo_eval``).
Latency and SLOs come from replaying one open-loop trace against the stable and the slow revision in
alternating blocks. Not at the same time: on two shared cores, two engines and the load generator
need more CPU than there is (measured at 8 req/s: stable 0.75 cores, slow 1.28), and a saturated
host measured either arm at 3 to 25 times its own time per token, in either order. Alternating
blocks of a few seconds keep the arms in one window, so drift on the host reaches both.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from revgate.evaluation import metrics
from revgate.evaluation.evidence import build_evidence, read_records, reference_task_grade
from revgate.evaluation.gates import Evidence, QualityGate, gates_from_policy, judge
from revgate.evaluation.records import Arm, RequestRecord
from revgate.evaluation.replay import replay
from revgate.evaluation.traces import TraceEntry, generate_trace
from revgate.manifests.gates import GatePolicy
from revgate.serving.worker.engine import EngineProcess, serve
from revgate.zoo.evaluate import ZOO_EXECUTION
from revgate.zoo.index import load_revisions

pytestmark = [pytest.mark.engine, pytest.mark.gated]

REGRESSED = "family=sort,length=long"  # the zoo's slice-regressed revision down-weighted sort/long


def load(zoo_dir: Path, revision: str, kind: str, arm: Arm) -> tuple[RequestRecord, ...]:
    suffix = ".jsonl" if kind == "quality" else f".{kind}.jsonl"
    return tuple(replace(r, arm=arm) for r in read_records(zoo_dir / "eval" / f"{revision}{suffix}"))


def quality_evidence(zoo_dir: Path, candidate: str) -> Evidence:
    stable = load(zoo_dir, "stable", "quality", "stable")
    return build_evidence(stable, load(zoo_dir, candidate, "quality", "candidate"), reference_task_grade, final=True)


def quality_policy(evidence: Evidence, slice_keys: tuple[str, ...]) -> GatePolicy:
    """The stage plan fits the evaluation set: its per-slice size is the horizon, four looks.

    With 300 answers per slice and arm, a 10-point margin is about the smallest non-inferiority
    that can be shown at alpha 0.05 / 6 slices; the regressed slice drops 16 points.
    """
    per_slice = _per_slice(evidence, slice_keys)
    return GatePolicy.build(
        slice_keys=list(slice_keys),
        quality_margin="0.1",
        max_samples_per_stage=per_slice,
        look_every=max(1, per_slice // 4),
        min_samples_per_slice=min(30, per_slice),
        latency_metrics=[],
    )


def _per_slice(evidence: Evidence, keys: tuple[str, ...]) -> int:
    counts: dict[str, int] = {}
    for record in evidence.stable:
        name = metrics.slice_name(record, keys)
        counts[name] = counts.get(name, 0) + 1
    return min(counts.values())


def test_slice_regression_is_caught_on_its_slice_while_the_average_passes(zoo_dir: Path, zoo_eval: object) -> None:
    evidence = quality_evidence(zoo_dir, "slice-regressed")
    per_slice = quality_policy(evidence, ("family", "length"))
    result = QualityGate(per_slice).evaluate(evidence)
    outcomes = {s.slice: s.outcome for s in result.slices}
    assert result.outcome == "fail", result
    assert outcomes[REGRESSED] == "fail"
    assert [name for name, outcome in outcomes.items() if outcome == "fail"] == [REGRESSED]
    # The same test on the pooled average (one slice, the whole evaluation set) does not fail it.
    pooled = quality_policy(evidence, ())
    average = QualityGate(pooled).evaluate(evidence)
    assert average.outcome != "fail", average
    stable_mean = np.mean(list(evidence.stable_scores.values()))
    assert np.mean(list(evidence.candidate_scores.values())) >= stable_mean - float(pooled.quality_margin)


def test_improved_revision_passes_every_slice(zoo_dir: Path, zoo_eval: object) -> None:
    evidence = quality_evidence(zoo_dir, "improved")
    policy = quality_policy(evidence, ("family", "length"))
    report = judge(gates_from_policy(policy), policy, evidence)
    assert report.gates[0].outcome == "pass", report.gates[0]
    assert {s.outcome for s in report.gates[0].slices} == {"pass"}


def slo_policy(stable: tuple[RequestRecord, ...]) -> GatePolicy:
    """An SLO the stable revision meets in the same window, with room: TPOT and E2E within 1.6x its median.

    Unloaded at 3 to 8 req/s, slow takes 2.3 to 2.5 times stable's time per token (7.4 to 8.9 ms
    against 3.2 to 3.6 at the median), so it rarely attains this target. The median, not a tail
    quantile: a burst of other work on the host during a few stable blocks moved stable's p90 enough
    that slow once attained 84% of a target set at 1.2x that p90.
    """
    tpot = float(np.median(metrics.latencies_ms(stable, "tpot")))
    e2e = float(np.median(metrics.latencies_ms(stable, "e2e")))
    n = len(stable)
    return GatePolicy.build(
        slo=[{"tpot_ms": math.ceil(1.6 * tpot), "e2e_ms": math.ceil(1.6 * e2e), "attainment": "0.7"}],
        latency_metrics=["tpot"],
        latency_margin="0.25",
        max_samples_per_stage=n,
        look_every=max(1, n // 4),
        min_samples_per_slice=min(30, n),
    )


@pytest.fixture(scope="module")
def vllm_slow(zoo_dir: Path) -> Iterator[EngineProcess]:
    """The slow revision served beside the session's stable server."""
    revisions = load_revisions(zoo_dir)
    with serve(zoo_dir / revisions["slow"].path, ZOO_EXECUTION, "slow") as engine:
        engine.wait_healthy()
        yield engine


def alternating_replay(
    trace: list[TraceEntry], stable_url: str, candidate_url: str, block: int = 10
) -> tuple[tuple[RequestRecord, ...], tuple[RequestRecord, ...]]:
    """Each block of the open-loop trace against one revision, then the other (who goes first alternates)."""
    arms: dict[str, list[RequestRecord]] = {"stable": [], "candidate": []}
    for number, first in enumerate(range(0, len(trace), block)):
        chunk = [replace(e, offset_s=e.offset_s - trace[first].offset_s) for e in trace[first : first + block]]
        order = [("stable", stable_url), ("candidate", candidate_url)]
        for arm, url in order if number % 2 == 0 else order[::-1]:
            run = asyncio.run(replay(chunk, url + "/v1", "stable" if arm == "stable" else "slow"))
            assert len(run.records) == len(chunk)
            arms[arm] += [replace(r, arm=arm) for r in run.records]
    return tuple(arms["stable"]), tuple(arms["candidate"])


def test_slow_revision_fails_on_slo_and_latency(
    zoo_dir: Path, zoo_eval: object, vllm_stable: EngineProcess, vllm_slow: EngineProcess
) -> None:
    # Fixed-length answers (16 tokens, EOS ignored) so every request has a TPOT; 3 req/s leaves CPU spare.
    # The arms take turns every 2 requests, so a burst of other work on the host falls on both alike.
    # The stage goes on while a gate is undecided, as a rollout's does, up to 240 requests per arm:
    # with the other core busy, 80 per arm once left slow's attainment (0.56) and its bounds
    # [0.38, 0.73] around the 0.7 target, rightly undecided.
    fixed = {"max_tokens": 16, "ignore_eos": True}
    stable: tuple[RequestRecord, ...] = ()
    slow: tuple[RequestRecord, ...] = ()
    for seed in (11, 12, 13):
        trace = [replace(e, body=e.body | fixed) for e in generate_trace(80, 3.0, seed=seed)]
        more_stable, more_slow = alternating_replay(trace, vllm_stable.url, vllm_slow.url, block=2)
        for records in (more_stable, more_slow):
            ok = [r for r in records if r.outcome == "ok"]
            assert len(records) == len(trace) and len(ok) >= 0.95 * len(trace), {r.error for r in records}
            assert {r.output_tokens for r in ok} == {16} and all(r.ttft_s is not None for r in ok)
        stable, slow = stable + more_stable, slow + more_slow
        policy = slo_policy(stable)
        report = judge(gates_from_policy(policy), policy, Evidence(stable, slow, final=True))
        by_gate = {g.gate: g for g in report.gates}
        if "inconclusive" not in {by_gate["slo-*"].outcome, by_gate["latency-tpot"].outcome}:
            break
    assert by_gate["slo-*"].outcome == "fail", by_gate["slo-*"]
    assert by_gate["latency-tpot"].outcome == "fail", by_gate["latency-tpot"]
    assert report.outcome == "fail" and report.notes[0].startswith("stable may serve")  # one window for both
    # The SLO is one stable meets: judged on its own traffic, the SLO gate never fails it. (Whether it can already
    # say "pass" at this sample size moves with the host's load: with the other core busy, stable's own spread
    # brought its attainment near the target and the gate stayed inconclusive, rightly.)
    itself = Evidence(stable, tuple(replace(r, arm="candidate") for r in stable), final=True)
    assert {g.gate: g.outcome for g in judge(gates_from_policy(policy), policy, itself).gates}["slo-*"] != "fail"
    # Its answers are stable's (zero-initialised extra layers): quality alone would have passed it.
    evidence = quality_evidence(zoo_dir, "slow")
    assert QualityGate(quality_policy(evidence, ("family", "length"))).evaluate(evidence).outcome != "fail"
