"""`revgate gate --grader judge`: every answer is scored by a model behind an OpenAI-compatible
chat endpoint, over real HTTP. The judge here is a scripted server (the reference models are too
small to follow a rubric): it scores 1 when the answer equals the reference, as a rubric would say."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from revgate.cli.main import main
from tests.integration.judge_server import judge_server
from tests.unit.test_cli_evaluate import write_arms

ASKED: list[dict[str, Any]] = []  # what the judge was asked, in order
ANSWER = re.compile(r"Reference \(may be empty\):\n(.*)\n\nAnswer:\n(.*)$", re.DOTALL)


def score_against_reference(prompt: str) -> dict[str, Any]:
    """Scores 1 when the answer in the prompt equals the reference in it."""
    found = ANSWER.search(prompt)
    score = 1 if found and found.group(1) == found.group(2) else 0
    return {"score": score, "reason": "matches the reference" if score else "differs"}


@pytest.fixture
def judge_url() -> Iterator[str]:
    with judge_server(score_against_reference, ASKED) as url:
        yield url


def test_a_judge_model_scores_the_answers_and_the_gate_fails_the_regressed_slice(
    tmp_path: Path, policy_file: Path, judge_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    records = write_arms(tmp_path, {"add": 0.98, "rev": 0.6, "sort": 0.98})
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Score 1 when the answer equals the reference exactly, else 0.")
    ASKED.clear()
    argv = ["gate", str(records), "--policy", str(policy_file), "--final", "--grader", "judge",
            "--judge-url", judge_url, "--judge-model", "grader-7b", "--rubric", str(rubric)]
    code = main(argv)
    printed = capsys.readouterr().out
    assert code == 1 and "family=rev" in printed
    assert len(ASKED) == 1800  # every answer of both arms, once
    asked = ASKED[0]
    assert asked["model"] == "grader-7b" and asked["temperature"] == 0
    assert "equals the reference exactly" in asked["messages"][0]["content"]


def test_an_unreachable_judge_is_a_clear_error(
    tmp_path: Path, policy_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = write_arms(tmp_path, {"add": 0.9, "rev": 0.9, "sort": 0.9})
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("be exact")
    out = tmp_path / "report.json"
    argv = ["gate", str(records), "--policy", str(policy_file), "--grader", "judge", "--judge-url",
            "http://127.0.0.1:9/v1", "--rubric", str(rubric), "--out", str(out)]
    assert main(argv) == 2
    assert "GraderError: judge unreachable" in capsys.readouterr().err and not out.exists()
    assert main(["gate", str(records), "--policy", str(policy_file), "--grader", "judge"]) == 2
    assert "--grader judge needs --judge-url and --rubric" in capsys.readouterr().err
