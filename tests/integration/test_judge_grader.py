"""`revgate gate --grader judge`: every answer is scored by a model behind an OpenAI-compatible
chat endpoint, over real HTTP. The judge here is a scripted server (the reference models are too
small to follow a rubric): it scores 1 when the answer equals the reference, as a rubric would say."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from tests.unit.test_cli_evaluate import write_arms

ASKED: list[dict[str, Any]] = []
ANSWER = re.compile(r"Reference \(may be empty\):\n(.*)\n\nAnswer:\n(.*)$", re.DOTALL)


class Judge(BaseHTTPRequestHandler):
    """Scores 1 when the answer in the prompt equals the reference in it."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ASKED.append(body)
        found = ANSWER.search(body["messages"][0]["content"])
        score = 1 if found and found.group(1) == found.group(2) else 0
        content = json.dumps({"score": score, "reason": "matches the reference" if score else "differs"})
        reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def judge_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


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
