"""A scripted OpenAI-compatible judge over real HTTP, for the tests of judge graders.

The reference models are too small to follow a rubric, so the judge's reply is computed: each test
gives the function from the judge's prompt (the user message) to the JSON content it answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

from revgate.evaluation.reference_task import is_correct, reference_answer
from tests.integration.s3_proxy import serving

Reply = Callable[[str], dict[str, Any]]
PAIRWISE = re.compile(
    r"Request:\n(.*)\n\nReference \(may be empty\):\n.*\n\nAnswer A:\n(.*)\n\nAnswer B:\n(.*)$", re.DOTALL
)


@contextmanager
def judge_server(reply: Reply, asked: list[dict[str, Any]] | None = None) -> Iterator[str]:
    """Serve ``reply`` at ``/v1/chat/completions``; its base URL. Every request body goes into ``asked``."""
    seen: list[dict[str, Any]] = asked if asked is not None else []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            content = json.dumps(reply(body["messages"][0]["content"]))
            data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield url + "/v1"


def prefer_correct(solve: Callable[[str], str], right: Callable[[str, str], bool]) -> Reply:
    """A pairwise judge that works the task out and prefers the right answer; "A" when it cannot tell."""

    def reply(prompt: str) -> dict[str, Any]:
        found = PAIRWISE.search(prompt)
        assert found is not None, prompt
        answer = solve(found.group(1))
        a_ok, b_ok = right(found.group(2), answer), right(found.group(3), answer)
        return {"preference": "B" if b_ok and not a_ok else "A", "reason": "worked the task out"}

    return reply


def reference_task_judge() -> Reply:
    """The pairwise judge for the reference task's prompts (``sort 3142=``), as users send them."""
    return prefer_correct(lambda request: reference_answer(request.strip()), is_correct)
