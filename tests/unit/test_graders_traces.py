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

from evaluation import evidence, graders, traces
from evaluation.records import RequestRecord


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
    sent: list[dict[str, Any]] = []

    def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
        sent.append(body | {"url": url})
        return {"choices": [{"message": {"content": 'Sure: {"score": 0.75, "reason": "close"}'}}]}

    grade = graders.judge_grader("http://judge/v1/", "judge-model", "be exact", post=post)(record("7", "7"))
    assert grade == graders.Grade(0.75, "close")
    assert sent[0]["url"] == "http://judge/v1/chat/completions" and "be exact" in sent[0]["messages"][0]["content"]
    assert graders.parse_judge_reply("no idea").score == 0.0


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
