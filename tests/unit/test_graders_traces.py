"""Graders, traces and the record/evidence helpers: pure logic, no servers."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from revgate.evaluation import evidence, graders, traces
from revgate.evaluation.records import RequestRecord
from revgate.manifests.seam import Answer, Exchange, MemoryTransport


def record(text: str | None, reference: str | None = None, **fields: Any) -> RequestRecord:
    base: dict[str, Any] = {"request_id": "r1", "revision": "x", "arm": "candidate", "arrival_s": 0.0, "outcome": "ok"}
    return RequestRecord(**(base | {"output_text": text, "reference": reference} | fields))


def test_reference_match_exact_and_normalised() -> None:
    assert graders.exact_match(record("42", "42")) == graders.Grade(1.0, "exact match")
    assert graders.exact_match(record(" 42.", "42")).score == 0.0  # type: ignore[union-attr]
    assert graders.normalised_match(record("  Forty\u00a0Two. ", "forty two")).score == 1.0  # type: ignore[union-attr]
    assert graders.exact_match(record("42")) is None  # unlabelled traffic is not graded


def test_regex_and_json_schema_graders() -> None:
    assert graders.regex_grader(r"\d+")(record("123")).score == 1.0  # type: ignore[union-attr]
    assert graders.regex_grader(r"\d+")(record("12a")).score == 0.0  # type: ignore[union-attr]
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}
    grade = graders.json_schema_grader(schema)
    assert grade(record('{"answer": 7}')).score == 1.0  # type: ignore[union-attr]
    bad = grade(record('{"answer": "7"}'))
    assert bad is not None and bad.score == 0.0 and "schema" in bad.reason
    assert "not JSON" in grade(record("seven")).reason  # type: ignore[union-attr]
    with pytest.raises(graders.GraderError, match="invalid JSON schema"):
        graders.json_schema_grader({"type": 12})


def test_refusal_empty_and_stop_reason() -> None:
    assert graders.not_refusal_or_empty(record("   ")).reason == "empty output"  # type: ignore[union-attr]
    assert graders.not_refusal_or_empty(record("I'm sorry, but I can't help")).reason == "refusal"  # type: ignore[union-attr]
    assert graders.not_refusal_or_empty(record("7")).score == 1.0  # type: ignore[union-attr]
    stop = graders.stop_reason_grader()
    assert stop(record("7", finish_reason="length")).score == 0.0  # type: ignore[union-attr]
    assert stop(record("7", finish_reason="stop")).score == 1.0  # type: ignore[union-attr]


def test_all_of_takes_the_worst_applicable_grade() -> None:
    combined = graders.all_of(graders.exact_match, graders.not_refusal_or_empty)
    assert combined(record("7", "7")).score == 1.0  # type: ignore[union-attr]
    assert combined(record("8", "7")).score == 0.0  # type: ignore[union-attr]


def test_judge_grader_sends_the_rubric_and_reads_the_score() -> None:
    judge = MemoryTransport({("POST", "/v1/chat/completions"): lambda exchange: (
        200, {"choices": [{"message": {"content": 'Sure: {"score": 0.75, "reason": "close"}'}}]})})

    grade = graders.judge_grader("http://judge/v1/", "judge-model", "be exact", transport=judge)(record("7", "7"))
    assert grade == graders.Grade(0.75, "close")
    sent = judge.exchanges[0]
    assert sent.url == "http://judge/v1/chat/completions"
    assert "be exact" in json.loads(sent.body or b"")["messages"][0]["content"]
    assert graders.parse_judge_reply("no idea").score == 0.0


def test_a_judge_reply_that_is_not_a_chat_completion_is_a_grader_error_naming_the_field() -> None:
    judge = MemoryTransport({("POST", "/v1/chat/completions"): lambda exchange: (200, {"choices": []})})
    with pytest.raises(graders.GraderError, match="choices") as caught:
        graders.judge_grader("http://judge/v1", "m", "be exact", transport=judge)(record("7", "7"))
    assert caught.value.where == "POST http://judge/v1/chat/completions"
    refused = MemoryTransport({("POST", "/v1/chat/completions"): lambda exchange: (
        503, {"error": {"message": "loading", "type": "unavailable"}})})
    with pytest.raises(graders.GraderError, match="judge answered 503: unavailable: loading"):
        graders.judge_grader("http://judge/v1", "m", "be exact", transport=refused)(record("7", "7"))


def test_generated_trace_is_reproducible_and_labelled_as_asked(tmp_path: Path) -> None:
    trace = traces.generate_trace(400, 50.0, seed=3, labelled_fraction=0.25, mix={"sort/long": 3})
    assert trace == traces.generate_trace(400, 50.0, seed=3, labelled_fraction=0.25, mix={"sort/long": 3})
    labelled = sum(e.reference is not None for e in trace) / len(trace)
    assert 0.18 < labelled < 0.32
    sort_long = sum(e.slices == e.slices | {"family": "sort", "length": "long"} for e in trace) / len(trace)
    assert sort_long > 0.3  # weight 3 of 8
    assert all(a.offset_s <= b.offset_s for a, b in itertools.pairwise(trace))
    path = tmp_path / "t.jsonl"
    traces.write_trace(trace, path)
    assert traces.read_trace(path) == trace


def test_poisson_and_bursty_arrivals_keep_the_mean_rate_but_differ_in_spread() -> None:
    def gaps(kind: traces.Arrivals) -> list[float]:
        offsets = traces.arrival_offsets(random.Random(1), 20000, 100.0, kind)
        return [b - a for a, b in itertools.pairwise(offsets)]

    for kind in ("poisson", "bursty"):
        mean = sum(gaps(kind)) / 19999  # type: ignore[arg-type]
        assert 0.008 < mean < 0.012
    cv = {k: (sum(g * g for g in gaps(k)) / 19999) ** 0.5 / (sum(gaps(k)) / 19999) for k in ("poisson", "bursty")}  # type: ignore[arg-type]
    assert cv["bursty"] > cv["poisson"] * 1.1


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("{", "not a trace entry"),
        ('{"request_id": "a", "offset_s": -1, "body": {}}', "offset_s"),
        ('{"request_id": "a", "offset_s": 0, "body": {}, "endpoint": "/v1/embeddings"}', "endpoint"),
        ('{"request_id": "a", "offset_s": 0, "body": {}, "colour": 1}', "not a trace entry"),
    ],
)
def test_bad_trace_line_is_named(tmp_path: Path, line: str, named: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"request_id": "ok", "offset_s": 0, "body": {}}\n' + line + "\n")
    with pytest.raises(traces.TraceInvalid, match=named) as caught:
        traces.read_trace(path)
    assert f"{path}:2" in str(caught.value)


def test_records_round_trip_and_arms_split(tmp_path: Path) -> None:
    rows = [record("7", "7", request_id=f"s{i}", arm="stable") for i in range(3)]
    rows += [record("8", "7", request_id=f"c{i}", arm="candidate") for i in range(2)]
    path = tmp_path / "r.jsonl"
    evidence.write_records(rows, path)
    loaded = evidence.read_records(path)
    assert loaded == rows
    stable, candidate = evidence.split_arms(loaded)
    assert (len(stable), len(candidate)) == (3, 2)
    ev = evidence.build_evidence(stable, candidate, evidence.reference_task_grade)
    assert set(ev.stable_scores.values()) == {1.0} and set(ev.candidate_scores.values()) == {0.0}
    with pytest.raises(evidence.RecordsInvalid, match="0 stable"):
        evidence.split_arms(candidate)
    path.write_text(path.read_text() + '{"request_id": 1}\n')
    with pytest.raises(evidence.RecordsInvalid, match=r"r.jsonl:6"):
        evidence.read_records(path)


def test_the_router_side_of_evaluation_stays_free_of_scipy() -> None:
    code = "import sys, evaluation.records, evaluation.metrics, evaluation.traces; print('scipy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout.strip().lower()) is False


# --- pair graders ----------------------------------------------------------------------------------


def pair(stable_text: str | None, candidate_text: str | None, **fields: Any) -> graders.AnswerPair:
    stable = record(stable_text, arm="stable", **fields)
    return graders.AnswerPair(stable, record(candidate_text, **fields), prompt="sort 3 1 2")


def test_empty_and_refusal_are_separate_checks_that_skip_failed_requests() -> None:
    assert graders.not_empty(record(" \n")) == graders.Grade(0.0, "empty output")
    assert graders.not_empty(record("I can't help")) == graders.Grade(1.0, "answered")
    assert graders.not_refusal(record("I can't help")) == graders.Grade(0.0, "refusal")
    assert graders.not_refusal(record("")) == graders.Grade(1.0, "no refusal")
    assert graders.not_empty(record(None, outcome="error")) is None


def test_a_record_grader_scores_both_answers_of_a_pair() -> None:
    valid_json = graders.both_sides(graders.json_schema_grader({"type": "object"}))
    grade = valid_json(pair('{"a": 1}', "a: 1"))
    assert grade is not None and (grade.stable, grade.candidate) == (1.0, 0.0)
    stop = graders.both_sides(graders.stop_reason_grader())
    truncated = graders.AnswerPair(record("1 2 3", finish_reason="stop"), record("1 2", finish_reason="length"))
    assert stop(truncated) == graders.PairGrade(1.0, 0.0, "stable: finish reason stop; candidate: finish reason length")
    failed = graders.AnswerPair(record("x"), record(None, outcome="error"))
    assert stop(failed) is None  # one side does not apply: no pair
    from revgate.manifests.gates import PairedGrader

    policy_stop = graders.pair_grader(PairedGrader(name="stop", kind="stop-reason"))
    unknown = graders.AnswerPair(record("1 2 3", finish_reason="stop"), record("1 2 3"))
    assert policy_stop(unknown) is None  # a finish reason one side did not record is missing, not a loss
    assert policy_stop(truncated) == graders.PairGrade(
        1.0, 0.0, "stable: finish reason stop; candidate: finish reason length"
    )


def test_length_ratio_against_the_stable_answer() -> None:
    ratio = graders.length_ratio_grader(0.5, 2.0)
    assert ratio(pair("1 2 3 4", "1 2 3")) == graders.PairGrade(1.0, 1.0, "length ratio 0.71 within")
    assert ratio(pair("1 2", "1 2 3 4 5 6 7 8 9")).candidate == 0.0  # type: ignore[union-attr]
    tokens = graders.AnswerPair(record("abc", output_tokens=10), record("a much longer text", output_tokens=12))
    assert ratio(tokens).candidate == 1.0  # type: ignore[union-attr]  # tokens when both were counted
    assert ratio(pair("", "anything")) is None  # no ratio to an empty answer


class ScriptedJudge:
    """Prefers the answer equal to the reference; otherwise always says "A" (an order-biased judge)."""

    def __init__(self, reply: str | None = None) -> None:
        self.prompts: list[str] = []
        self.reply = reply

    def __call__(self, exchange: Exchange, timeout_s: float) -> Answer:
        """A judge's chat endpoint, answered in process (the seam's transport)."""
        assert exchange.url.endswith("/chat/completions")
        prompt = json.loads(exchange.body or b"")["messages"][0]["content"]
        self.prompts.append(prompt)
        reference = prompt.split("Reference (may be empty):\n")[1].split("\n\nAnswer A:")[0]
        a = prompt.split("Answer A:\n")[1].split("\n\nAnswer B:")[0]
        b = prompt.split("Answer B:\n")[1]
        choice = "B" if b == reference and a != reference else "A"
        content = self.reply or json.dumps({"preference": choice, "reason": "scripted"})
        return Answer(200, json.dumps({"choices": [{"message": {"content": content}}]}).encode())


def test_the_pairwise_judge_is_asked_twice_and_order_bias_becomes_a_tie() -> None:
    judge = ScriptedJudge()
    grade = graders.pairwise_judge(graders.JudgeEndpoint("http://judge/v1", "j", judge), "correct first")
    better = grade(pair("1 2 3", "3 2 1", reference="1 2 3"))
    assert better is not None and (better.stable, better.candidate) == (1.0, 0.0)
    worse = grade(pair("3 2 1", "1 2 3", reference="1 2 3"))
    assert worse is not None and (worse.stable, worse.candidate) == (0.0, 1.0)
    biased = grade(pair("3 1 2", "2 1 3", reference="1 2 3"))  # neither right: the judge says "A" both times
    assert biased is not None and (biased.stable, biased.candidate) == (0.5, 0.5)
    assert len(judge.prompts) == 6
    first, swapped = judge.prompts[0], judge.prompts[1]
    assert "Answer A:\n1 2 3\n\nAnswer B:\n3 2 1" in first and "Answer A:\n3 2 1\n\nAnswer B:\n1 2 3" in swapped
    assert "Request:\nsort 3 1 2" in first and "correct first" in first


def test_a_judge_reply_without_a_preference_leaves_the_pair_ungraded() -> None:
    judge = ScriptedJudge(reply="I think both are fine")
    grade = graders.pairwise_judge(graders.JudgeEndpoint("http://judge/v1", "j", judge), "r")
    assert grade(pair("a", "b")) is None
    assert [graders.parse_preference(t) for t in ('{"preference": "b"}', '{"preference": "TIE"}', '{"x": 1}')] == [
        "B",
        "tie",
        None,
    ]
    assert graders.preferred("A", "A") == "tie" and graders.preferred("B", "A") == "candidate"


def test_the_policy_names_the_pair_graders_and_their_scores_feed_the_evidence() -> None:
    from revgate.manifests.gates import GatePolicy

    policy = GatePolicy.build(
        paired={
            "graders": [
                {"name": "ref", "kind": "reference"},
                {"name": "schema", "kind": "json-schema", "json_schema": {"type": "object"}},
                {"name": "digits", "kind": "regex", "pattern": r"[0-9 ]+"},
                {"name": "judge", "kind": "judge-pairwise", "rubric": "r"},
            ]
        }
    )
    assert policy.paired is not None
    with pytest.raises(graders.GraderError, match="needs a judge endpoint"):
        graders.pair_graders(policy.paired.graders)
    built = graders.pair_graders(policy.paired.graders, graders.JudgeEndpoint("http://j/v1", "j", ScriptedJudge()))
    assert sorted(built) == ["digits", "judge", "schema"]
    stable = [record("1 2", request_id="a", arm="stable"), record("3", request_id="b", arm="stable")]
    candidate = [record("1 2", request_id="a"), record("x", request_id="c")]
    pairs = graders.answer_pairs(stable, candidate, {"a": "sort 2 1"})
    assert [(p.request_id, p.prompt) for p in pairs] == [("a", "sort 2 1")]  # only mirrored requests pair
    scores = graders.grade_pairs(pairs, built)
    assert scores["digits"] == {"a": (1.0, 1.0)} and scores["schema"] == {"a": (0.0, 0.0)}
    assert scores["judge"] == {"a": (0.5, 0.5)}


def test_a_paired_record_keeps_the_shadow_finish_reason_and_reads_older_lines() -> None:
    from revgate.shadow.records import PairedRecord

    fields: dict[str, Any] = {
        "request_id": "r",
        "route": "chat",
        "generation": 2,
        "path": "/v1/chat/completions",
        "stable_revision": "s",
        "shadow_revision": "c",
        "stable_status": 200,
        "stable_output": "a",
        "stable_ttft_s": 0.1,
        "stable_e2e_s": 0.3,
        "shadow_status": 200,
        "shadow_output": "b",
        "shadow_ttft_s": 0.2,
        "shadow_e2e_s": 0.5,
    }
    older = PairedRecord.from_json(json.dumps(fields))
    assert older.shadow_finish_reason is None
    truncated = PairedRecord(**(fields | {"shadow_finish_reason": "length"}))
    assert PairedRecord.from_json(truncated.to_json()) == truncated
