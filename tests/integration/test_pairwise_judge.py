"""Paired shadow quality from a pairwise judge over real HTTP, without reference answers.

The judge is a scripted OpenAI-compatible server (the reference models are too small to judge):
it works the task out from the request itself, prefers the answer that gets it right, and when it
cannot tell it always answers "A", an order bias the position swap must cancel.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from revgate.evaluation import graders
from revgate.evaluation.gates import Evidence, gates_from_policy, judge
from revgate.evaluation.records import Arm, RequestRecord
from revgate.manifests.gates import GatePolicy
from tests.integration.judge_server import judge_server, prefer_correct

ASKED: list[dict[str, Any]] = []  # what the judge was asked, in order


def solve(request: str) -> str:
    """What a capable judge would work out from the request."""
    task, _, items = request.partition(": ")
    words = items.split()
    if task == "add":
        return str(sum(int(w) for w in words))
    return " ".join(reversed(words)) if task == "rev" else " ".join(sorted(words, key=int))


@pytest.fixture
def judge_url() -> Iterator[str]:
    """Prefers the correct answer; with both or neither correct, says "A" (order bias)."""
    with judge_server(prefer_correct(solve, lambda answer, right: answer == right), ASKED) as url:
        yield url


Shadow = tuple[list[RequestRecord], list[RequestRecord], dict[str, str]]


def mirrored(n: int, candidate_right: dict[str, float], seed: int = 5) -> Shadow:
    """Users' prompts (no references) answered by stable (right 90 %) and the candidate, per task."""
    rng = np.random.default_rng(seed)
    stable: list[RequestRecord] = []
    candidate: list[RequestRecord] = []
    prompts: dict[str, str] = {}
    for i in range(n):
        task = ("add", "rev", "sort")[i % 3]
        numbers = [str(int(x)) for x in rng.integers(1, 50, size=4)]
        prompts[f"u{i}"] = prompt = f"{task}: {' '.join(numbers)}"
        right, wrong = solve(prompt), " ".join(numbers[::-1]) if task != "rev" else " ".join(numbers)
        arms: tuple[tuple[Arm, float, list[RequestRecord]], ...] = (
            ("stable", 0.9, stable),
            ("candidate", candidate_right[task], candidate),
        )
        for arm, p, out in arms:
            text = right if rng.random() < p else wrong
            out.append(
                RequestRecord(
                    f"u{i}",
                    f"rev-{arm}",
                    arm,
                    i * 0.1,
                    "ok",
                    slices={"task": task},
                    output_text=text,
                    first_token_s=i * 0.1 + 0.05,
                    last_token_s=i * 0.1 + 0.2,
                )
            )
    return stable, candidate, prompts


def shadow_policy(margin: str = "0.02") -> GatePolicy:
    return GatePolicy.build(
        slice_keys=["task"],
        min_samples_per_slice=50,
        paired={
            "max_pairs_per_stage": 300,
            "look_every": 50,
            "latency_metrics": [],
            "quality_margin": margin,
            "graders": [{"name": "judge", "kind": "judge-pairwise", "rubric": "Prefer the correct answer."}],
        },
    )


def judged(policy: GatePolicy, shadow: Shadow, url: str) -> tuple[list[graders.AnswerPair], Evidence]:
    """Pairs graded by the judge over HTTP, as evidence of the stage's end."""
    assert policy.paired is not None
    stable, candidate, prompts = shadow
    pairs = graders.answer_pairs(stable, candidate, prompts)
    scores = graders.grade_pairs(
        pairs, graders.pair_graders(policy.paired.graders, graders.JudgeEndpoint(url, "judge-7b"))
    )
    return pairs, Evidence(tuple(stable), tuple(candidate), pair_scores=scores, final=True)


def test_a_slice_regressed_candidate_fails_in_shadow_from_pairwise_judging_of_user_prompts(judge_url: str) -> None:
    policy = shadow_policy()
    ASKED.clear()
    pairs, evidence = judged(policy, mirrored(900, {"add": 0.9, "rev": 0.6, "sort": 0.9}), judge_url)
    assert len(ASKED) == 2 * len(pairs) == 1800  # each pair asked twice, positions swapped
    assert ASKED[0]["model"] == "judge-7b" and ASKED[0]["temperature"] == 0
    assert "Request:\nadd: " in ASKED[0]["messages"][0]["content"]  # the user's prompt, no reference
    same = [p.request_id for p in pairs if p.stable.output_text == p.candidate.output_text]
    assert same and all(evidence.pair_scores["judge"][rid] == (0.5, 0.5) for rid in same)  # the "A" bias cancelled

    report = judge(gates_from_policy(policy, paired_evidence=True), policy, evidence)
    quality = next(g for g in report.gates if g.gate == "quality-paired")
    outcomes = {s.slice: s.outcome for s in quality.slices}
    assert quality.outcome == "fail" and outcomes["judge/task=rev"] == "fail"
    assert outcomes["judge/task=add"] != "fail" and outcomes["judge/task=sort"] != "fail"
    assert report.outcome == "fail"


def test_an_equal_candidate_passes_although_the_judge_always_favours_the_first_answer(judge_url: str) -> None:
    policy = shadow_policy(margin="0.1")
    pairs, evidence = judged(policy, mirrored(900, {"add": 0.9, "rev": 0.9, "sort": 0.9}, seed=6), judge_url)
    # Asked once with stable first, the judge would favour stable on every pair it cannot tell apart.
    neither = [p for p in pairs if p.stable.output_text == p.candidate.output_text != solve(p.prompt)]
    assert neither and all(evidence.pair_scores["judge"][p.request_id] == (0.5, 0.5) for p in neither)
    quality = judge(gates_from_policy(policy, paired_evidence=True), policy, evidence).gates[0]
    assert quality.gate == "quality-paired" and quality.outcome == "pass", quality
