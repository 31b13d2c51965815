"""Graders: each turns one request record into a score in [0, 1] and a reason, or None when it does not apply.

Deterministic graders are pure functions of the record. The judge grader asks any OpenAI-compatible
chat endpoint to score an answer against a rubric; its HTTP call is the only I/O here.

Pair graders score the two answers to one mirrored request (stable's and the candidate's) for the
paired shadow gates: any record grader applied to both sides, the candidate's length against
stable's, and a pairwise judge asked twice with the answers in both orders.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import jsonschema  # type: ignore[import-untyped]
from pydantic import Field

from revgate.evaluation.records import RequestRecord
from revgate.manifests.errors import RevgateError
from revgate.manifests.gates import PairedGrader
from revgate.manifests.seam import Refused, ReplyDocument, ReplyInvalid, Seam, Transport, network

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


def not_empty(record: RequestRecord) -> Grade | None:
    """0 for an answer with no visible text, 1 otherwise (failed requests do not apply)."""
    if record.outcome != "ok":
        return None
    return Grade(1.0, "answered") if (record.output_text or "").strip() else Grade(0.0, "empty output")


def not_refusal(record: RequestRecord) -> Grade | None:
    """0 for an answer that refuses, 1 otherwise (failed requests do not apply)."""
    if record.outcome != "ok":
        return None
    return Grade(0.0, "refusal") if REFUSAL.search(record.output_text or "") else Grade(1.0, "no refusal")


def not_refusal_or_empty(record: RequestRecord) -> Grade | None:
    """0 for an empty or refusing answer, 1 otherwise."""
    text = (record.output_text or "").strip()
    if not text:
        return Grade(0.0, "empty output")
    if REFUSAL.search(text):
        return Grade(0.0, "refusal")
    return Grade(1.0, "answered")


def stop_reason_grader(allowed: Sequence[str] = ("stop",), *, unknown_applies: bool = True) -> Grader:
    """1 when the finish reason is one of ``allowed`` (e.g. a truncated 'length' answer scores 0).

    With ``unknown_applies`` off, an answer whose finish reason was not recorded is not graded
    (missing evidence) instead of scoring 0: a pair must not lose for a field one side lacks.
    """

    def grade(record: RequestRecord) -> Grade | None:
        if record.outcome != "ok" or (record.finish_reason is None and not unknown_applies):
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

class _JudgeMessage(ReplyDocument):
    content: str


class _JudgeChoice(ReplyDocument):
    message: _JudgeMessage


class JudgeReply(ReplyDocument):
    """The part of an OpenAI chat completion a judge is read for: the first choice's text."""

    choices: Annotated[tuple[_JudgeChoice, ...], Field(min_length=1)]


def ask_judge(base_url: str, model: str, prompt: str, transport: Transport = network) -> str:
    """One greedy question to the judge's chat endpoint (``.../v1``) through the seam; its answer's text."""
    body = {"model": model, "temperature": 0, "max_tokens": 128, "messages": [{"role": "user", "content": prompt}]}
    seam = Seam(base_url, service="judge", timeout_s=60.0, transport=transport)
    try:
        return seam.call("POST", "/chat/completions", JudgeReply, body).choices[0].message.content
    except OSError as error:
        raise GraderError(f"judge unreachable: {error}", where=seam.base_url + "/chat/completions",
                          fix="Start the judge model or fix the URL.") from None
    except (Refused, ReplyInvalid) as error:
        raise GraderError(f"judge reply is not a chat completion: {error.what}", where=error.where,
                          fix="Point at /v1 of an OpenAI-compatible server.") from None


def parse_judge_reply(text: str) -> Grade:
    """Read the judge's JSON reply; a reply without a usable score counts as 0 with the reason why."""
    match = re.search(r"\{.*\}", text, re.DOTALL)
    try:
        data = json.loads(match.group(0)) if match else {}
        score = float(data["score"])
    except (ValueError, KeyError, TypeError):
        return Grade(0.0, f"judge reply had no score: {text[:80]!r}")
    return Grade(min(max(score, 0.0), 1.0), str(data.get("reason", "")))


def judge_grader(base_url: str, model: str, rubric: str, transport: Transport = network) -> Grader:
    """Ask an OpenAI-compatible chat endpoint (greedy) to score each answer against ``rubric``."""

    def grade(record: RequestRecord) -> Grade | None:
        if record.outcome != "ok":
            return None
        prompt = JUDGE_PROMPT.format(rubric=rubric, reference=record.reference or "", answer=record.output_text or "")
        return parse_judge_reply(ask_judge(base_url, model, prompt, transport))

    return grade


def score_records(records: Sequence[RequestRecord], grader: Grader) -> dict[str, float]:
    """Scores by request id for the records the grader applies to."""
    scores: dict[str, float] = {}
    for record in records:
        grade = grader(record)
        if grade is not None:
            scores[record.request_id] = grade.score
    return scores


# --- pair graders for the paired shadow gates ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class AnswerPair:
    """Stable's and the candidate's answers to one mirrored request (the prompt when it was kept)."""

    stable: RequestRecord
    candidate: RequestRecord
    prompt: str = ""

    @property
    def request_id(self) -> str:
        """The mirrored request's id."""
        return self.stable.request_id


@dataclass(frozen=True, slots=True)
class PairGrade:
    """Scores in [0, 1] for stable's and the candidate's answer, and why."""

    stable: float
    candidate: float
    reason: str


class PairGrader(Protocol):
    """Scores both answers of a pair; None means the pair is not graded (missing evidence)."""

    def __call__(self, pair: AnswerPair) -> PairGrade | None: ...


def both_sides(grader: Grader) -> PairGrader:
    """A record grader applied to each answer; the pair counts only when it applies to both."""

    def grade(pair: AnswerPair) -> PairGrade | None:
        stable, candidate = grader(pair.stable), grader(pair.candidate)
        if stable is None or candidate is None:
            return None
        return PairGrade(stable.score, candidate.score, f"stable: {stable.reason}; candidate: {candidate.reason}")

    return grade


def answer_length(record: RequestRecord) -> int:
    """Output tokens when counted, else characters of the visible text."""
    return record.output_tokens if record.output_tokens is not None else len(record.output_text or "")


def length_ratio_grader(min_ratio: float, max_ratio: float) -> PairGrader:
    """The candidate scores 1 when its answer's length is within [min, max] times stable's (stable scores 1).

    Lengths are compared in the same unit on both sides: tokens when both were counted, else characters.
    """

    def grade(pair: AnswerPair) -> PairGrade | None:
        stable, candidate = pair.stable, pair.candidate
        if stable.outcome != "ok" or candidate.outcome != "ok":
            return None
        counted = stable.output_tokens is not None and candidate.output_tokens is not None
        s_len = answer_length(stable) if counted else len(stable.output_text or "")
        c_len = answer_length(candidate) if counted else len(candidate.output_text or "")
        if s_len == 0:
            return None  # no ratio to an empty answer; the empty-output grader judges that
        ratio = c_len / s_len
        inside = min_ratio <= ratio <= max_ratio
        return PairGrade(1.0, 1.0 if inside else 0.0, f"length ratio {ratio:.2f} {'within' if inside else 'outside'}")

    return grade


PAIRWISE_PROMPT = (
    "Two answers to the same request follow. Judge which better satisfies the rubric. Reply with JSON "
    'only: {{"preference": "A" or "B" or "tie", "reason": "<one sentence>"}}.\n\n'
    "Rubric:\n{rubric}\n\nRequest:\n{prompt}\n\nReference (may be empty):\n{reference}\n\n"
    "Answer A:\n{a}\n\nAnswer B:\n{b}"
)


@dataclass(frozen=True, slots=True)
class JudgeEndpoint:
    """An OpenAI-compatible chat endpoint (``.../v1``) and the model to ask."""

    base_url: str
    model: str
    transport: Transport = network


def parse_preference(text: str) -> str | None:
    """'A', 'B' or 'tie' from the judge's JSON reply; None when the reply has no usable preference."""
    match = re.search(r"\{.*\}", text, re.DOTALL)
    try:
        value = str(json.loads(match.group(0))["preference"]) if match else ""
    except (ValueError, KeyError, TypeError):
        return None
    normalised = value.strip().lower()
    return {"a": "A", "b": "B", "tie": "tie"}.get(normalised)


def _ask(endpoint: JudgeEndpoint, prompt: str) -> str | None:
    return parse_preference(ask_judge(endpoint.base_url, endpoint.model, prompt, endpoint.transport))


def preferred(first: str | None, swapped: str | None) -> str | None:
    """'stable', 'candidate' or 'tie' from two verdicts: first A = stable, then A = candidate.

    Only a preference that survives the swap counts; disagreement (order bias) is a tie. A reply
    without a preference leaves the pair ungraded rather than counting it as a tie.
    """
    if first is None or swapped is None:
        return None
    by_first = {"A": "stable", "B": "candidate", "tie": "tie"}[first]
    by_swapped = {"A": "candidate", "B": "stable", "tie": "tie"}[swapped]
    return by_first if by_first == by_swapped else "tie"


PREFERENCE_SCORES = {"stable": (1.0, 0.0), "candidate": (0.0, 1.0), "tie": (0.5, 0.5)}


def pairwise_judge(endpoint: JudgeEndpoint, rubric: str) -> PairGrader:
    """Ask the judge which answer is better, twice with the positions swapped, to cancel order bias."""

    def grade(pair: AnswerPair) -> PairGrade | None:
        if pair.stable.outcome != "ok" or pair.candidate.outcome != "ok":
            return None
        s_text, c_text = pair.stable.output_text or "", pair.candidate.output_text or ""
        fields = {"rubric": rubric, "prompt": pair.prompt, "reference": pair.stable.reference or ""}
        first = _ask(endpoint, PAIRWISE_PROMPT.format(a=s_text, b=c_text, **fields))
        swapped = _ask(endpoint, PAIRWISE_PROMPT.format(a=c_text, b=s_text, **fields))
        winner = preferred(first, swapped)
        if winner is None:
            return None
        stable, candidate = PREFERENCE_SCORES[winner]
        return PairGrade(stable, candidate, f"judge prefers {winner} (A/B: {first}, swapped: {swapped})")

    return grade


def pair_grader(spec: PairedGrader, judge: JudgeEndpoint | None = None) -> PairGrader:
    """The pair grader a policy's grader entry names (``reference`` is read from the stage's scores instead)."""
    if spec.kind == "judge-pairwise":
        if judge is None:
            raise GraderError(f"grader {spec.name!r} needs a judge endpoint", fix="Give the judge's URL and model.")
        return pairwise_judge(judge, spec.rubric or "")
    if spec.kind == "length-ratio":
        return length_ratio_grader(float(spec.min_ratio or 0), float(spec.max_ratio or 0))
    return both_sides(_record_grader(spec))


def _record_grader(spec: PairedGrader) -> Grader:
    if spec.kind == "json-schema":
        return json_schema_grader(spec.json_schema or {})
    if spec.kind == "regex":
        return regex_grader(spec.pattern or "")
    if spec.kind == "stop-reason":
        return stop_reason_grader(spec.allowed_finish, unknown_applies=False)
    by_kind: dict[str, Grader] = {"not-refusal": not_refusal, "not-empty": not_empty}
    if spec.kind not in by_kind:
        raise GraderError(f"grader {spec.name!r} of kind {spec.kind} is not a pair grader", fix="Use another kind.")
    return by_kind[spec.kind]


def grade_pairs(
    pairs: Sequence[AnswerPair], graders: dict[str, PairGrader]
) -> dict[str, dict[str, tuple[float, float]]]:
    """(stable, candidate) scores by grader name and request id, for :class:`evaluation.gates.Evidence`."""
    table: dict[str, dict[str, tuple[float, float]]] = {name: {} for name in graders}
    for pair in pairs:
        for name, grader in graders.items():
            if (grade := grader(pair)) is not None:
                table[name][pair.request_id] = (grade.stable, grade.candidate)
    return table


def pair_graders(specs: Sequence[PairedGrader], judge: JudgeEndpoint | None = None) -> dict[str, PairGrader]:
    """Every grader a policy names, by name (the ``reference`` kind reads the stage's own scores)."""
    return {spec.name: pair_grader(spec, judge) for spec in specs if spec.kind != "reference"}


def answer_pairs(
    stable: Sequence[RequestRecord], candidate: Sequence[RequestRecord], prompts: dict[str, str] | None = None
) -> list[AnswerPair]:
    """Pairs of records with the same request id (a mirrored request), with the prompt when one was kept."""
    by_id = {record.request_id: record for record in candidate}
    known = prompts or {}
    return [
        AnswerPair(record, by_id[record.request_id], known.get(record.request_id, ""))
        for record in stable
        if record.request_id in by_id
    ]
