"""Graders: each turns one request record into a score in [0, 1] and a reason, or None when it does not apply.

Deterministic graders are pure functions of the record. The judge grader asks any OpenAI-compatible
chat endpoint to score an answer against a rubric; its HTTP call is the only I/O here.
"""

from __future__ import annotations

import json
import re
import unicodedata
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import jsonschema  # type: ignore[import-untyped]

from evaluation.records import RequestRecord
from manifests.errors import RevgateError

REFUSAL = re.compile(
    r"\b(i can(?:'|no)t|i am unable|i'm unable|i won't|as an ai|i cannot help|i'm sorry, but)\b", re.IGNORECASE
)


class GraderError(RevgateError):
    """A grader could not be built or could not reach its judge."""


@dataclass(frozen=True, slots=True)
class Grade:
    """A score in [0, 1] and why."""

    score: float
    reason: str


class Grader(Protocol):
    """Scores one record; None means the grader does not apply (e.g. no reference answer)."""

    def __call__(self, record: RequestRecord) -> Grade | None: ...


def normalise(text: str) -> str:
    """Unicode NFKC, lower case, collapsed whitespace, trailing punctuation stripped."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(folded.split()).strip(" .!?")


def exact_match(record: RequestRecord) -> Grade | None:
    """1 when the output equals the reference byte for byte."""
    if record.reference is None:
        return None
    output = record.output_text or ""
    if output == record.reference:
        return Grade(1.0, "exact match")
    return Grade(0.0, f"expected {record.reference!r}, got {output[:80]!r}")


def normalised_match(record: RequestRecord) -> Grade | None:
    """1 when the output equals the reference after :func:`normalise`."""
    if record.reference is None:
        return None
    output = normalise(record.output_text or "")
    if output == normalise(record.reference):
        return Grade(1.0, "normalised match")
    return Grade(0.0, f"expected {normalise(record.reference)!r}, got {output[:80]!r}")


def regex_grader(pattern: str) -> Grader:
    """1 when the whole output matches ``pattern``."""
    compiled = re.compile(pattern, re.DOTALL)

    def grade(record: RequestRecord) -> Grade | None:
        if compiled.fullmatch(record.output_text or ""):
            return Grade(1.0, f"matches {pattern!r}")
        return Grade(0.0, f"does not match {pattern!r}")

    return grade


def json_schema_grader(schema: dict[str, Any]) -> Grader:
    """1 when the output parses as JSON and validates against ``schema``."""
    try:
        validator = jsonschema.Draft202012Validator(schema)
        validator.check_schema(schema)
    except jsonschema.SchemaError as error:
        raise GraderError(f"invalid JSON schema: {error.message}", fix="Give a valid JSON Schema.") from None

    def grade(record: RequestRecord) -> Grade | None:
        try:
            document = json.loads(record.output_text or "")
        except json.JSONDecodeError as error:
            return Grade(0.0, f"not JSON: {error.msg}")
        problem = jsonschema.exceptions.best_match(validator.iter_errors(document))
        return Grade(1.0, "valid") if problem is None else Grade(0.0, f"schema: {problem.message}")

    return grade


def not_refusal_or_empty(record: RequestRecord) -> Grade | None:
    """0 for an empty or refusing answer, 1 otherwise."""
    text = (record.output_text or "").strip()
    if not text:
        return Grade(0.0, "empty output")
    if REFUSAL.search(text):
        return Grade(0.0, "refusal")
    return Grade(1.0, "answered")


def stop_reason_grader(allowed: Sequence[str] = ("stop",)) -> Grader:
    """1 when the finish reason is one of ``allowed`` (e.g. a truncated 'length' answer scores 0)."""

    def grade(record: RequestRecord) -> Grade | None:
        if record.outcome != "ok":
            return None
        reason = record.finish_reason or "unknown"
        return Grade(1.0 if reason in allowed else 0.0, f"finish reason {reason}")

    return grade


def all_of(*graders: Grader) -> Grader:
    """The minimum of the applicable graders (every check must hold); reasons joined."""

    def grade(record: RequestRecord) -> Grade | None:
        grades = [g for g in (grader(record) for grader in graders) if g is not None]
        if not grades:
            return None
        worst = min(grades, key=lambda g: g.score)
        return Grade(worst.score, "; ".join(g.reason for g in grades))

    return grade


JUDGE_PROMPT = (
    "Grade the answer against the rubric. Reply with JSON only: "
    '{{"score": <number from 0 to 1>, "reason": "<one sentence>"}}.\n\n'
    "Rubric:\n{rubric}\n\nReference (may be empty):\n{reference}\n\nAnswer:\n{answer}"
)

Post = Callable[[str, dict[str, Any]], dict[str, Any]]


def _post_json(url: str, body: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
    request = urllib.request.Request(  # noqa: S310 - the judge URL is configured by the operator
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            result: dict[str, Any] = json.loads(response.read())
            return result
    except OSError as error:
        raise GraderError(
            f"judge unreachable: {error}", where=url, fix="Start the judge model or fix the URL."
        ) from None


def parse_judge_reply(text: str) -> Grade:
    """Read the judge's JSON reply; a reply without a usable score counts as 0 with the reason why."""
    match = re.search(r"\{.*\}", text, re.DOTALL)
    try:
        data = json.loads(match.group(0)) if match else {}
        score = float(data["score"])
    except (ValueError, KeyError, TypeError):
        return Grade(0.0, f"judge reply had no score: {text[:80]!r}")
    return Grade(min(max(score, 0.0), 1.0), str(data.get("reason", "")))


def judge_grader(base_url: str, model: str, rubric: str, post: Post = _post_json) -> Grader:
    """Ask an OpenAI-compatible chat endpoint (greedy) to score each answer against ``rubric``."""
    url = base_url.rstrip("/") + "/chat/completions"

    def grade(record: RequestRecord) -> Grade | None:
        if record.outcome != "ok":
            return None
        prompt = JUDGE_PROMPT.format(rubric=rubric, reference=record.reference or "", answer=record.output_text or "")
        body = {"model": model, "temperature": 0, "max_tokens": 128, "messages": [{"role": "user", "content": prompt}]}
        reply = post(url, body)
        try:
            text = str(reply["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError):
            raise GraderError(
                "judge reply is not a chat completion", where=url, fix="Point at /v1 of an OpenAI-compatible server."
            ) from None
        return parse_judge_reply(text)

    return grade


def score_records(records: Sequence[RequestRecord], grader: Grader) -> dict[str, float]:
    """Scores by request id for the records the grader applies to."""
    scores: dict[str, float] = {}
    for record in records:
        grade = grader(record)
        if grade is not None:
            scores[record.request_id] = grade.score
    return scores
