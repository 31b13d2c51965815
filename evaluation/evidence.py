"""Loading request records into gate evidence: read JSON lines, split the arms, grade the outputs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from revgate.evaluation import graders, reference_task
from revgate.evaluation.gates import Evidence
from revgate.evaluation.records import RequestRecord
from revgate.manifests.errors import RevgateError


class RecordsInvalid(RevgateError):
    """A records file is malformed or the arms cannot be told apart; nothing was judged."""


def read_records(path: Path) -> list[RequestRecord]:
    """Every record of a JSON-lines file; a bad line is named by file and line number."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise RecordsInvalid(
            f"cannot read records: {error.strerror}", where=str(path), fix="Give an existing records file."
        ) from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(RequestRecord.from_json(line))
        except (json.JSONDecodeError, TypeError) as error:
            raise RecordsInvalid(
                f"not a request record: {error}",
                where=f"{path}:{number}",
                fix="Each line must be one record as the router or replay writes it.",
            ) from None
    return records


def write_records(records: Sequence[RequestRecord], path: Path) -> None:
    """Write records as JSON lines atomically (temporary name, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)


def split_arms(
    records: Sequence[RequestRecord], stable: str | None = None, candidate: str | None = None
) -> tuple[tuple[RequestRecord, ...], tuple[RequestRecord, ...]]:
    """(stable, candidate): by revision when both are named, else by the records' arm field."""
    if stable is not None and candidate is not None:
        s = tuple(r for r in records if r.revision == stable)
        c = tuple(r for r in records if r.revision == candidate)
    else:
        s = tuple(r for r in records if r.arm == "stable")
        c = tuple(r for r in records if r.arm in ("candidate", "shadow"))
    if not s or not c:
        raise RecordsInvalid(
            f"found {len(s)} stable and {len(c)} candidate records",
            fix="Name --stable and --candidate revisions, or give records with arm stable and candidate.",
        )
    return s, c


def reference_task_grade(record: RequestRecord) -> graders.Grade | None:
    """The reference task's own exact match (first line of the completion, stripped)."""
    if record.reference is None:
        return None
    if reference_task.is_correct(record.output_text, record.reference):
        return graders.Grade(1.0, "correct")
    return graders.Grade(0.0, f"expected {record.reference!r}")


GRADERS: dict[str, graders.Grader] = {
    "reference-task": reference_task_grade,
    "exact": graders.exact_match,
    "normalised": graders.normalised_match,
}


def grade_arm(records: Sequence[RequestRecord], grader: graders.Grader) -> dict[str, float]:
    """Scores by request id: answered requests by ``grader``; a failed labelled request scores 0.

    A request that failed (error, timeout, cancelled, rejected) is a failed outcome for the user:
    it is counted as wrong wherever it carried a reference, never dropped from the quality evidence.
    """
    scores: dict[str, float] = {}
    for record in records:
        if record.outcome == "ok":
            grade = grader(record)
            if grade is not None:
                scores[record.request_id] = grade.score
        elif record.reference is not None:
            scores[record.request_id] = 0.0
    return scores


def build_evidence(
    stable: Sequence[RequestRecord],
    candidate: Sequence[RequestRecord],
    grader: graders.Grader,
    *,
    expected_candidate_share: float | None = None,
    final: bool = False,
    pair_scores: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
) -> Evidence:
    """Grade both arms (see :func:`grade_arm`) and bundle them, with any graded shadow pairs, as gate evidence."""
    return Evidence(
        tuple(stable),
        tuple(candidate),
        grade_arm(stable, grader),
        grade_arm(candidate, grader),
        expected_candidate_share=expected_candidate_share,
        final=final,
        pair_scores=pair_scores or {},
    )
