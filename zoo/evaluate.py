"""``revgate models eval``: serve each zoo revision with vLLM, grade it, time it, keep the records.

Per revision, one real vLLM server (the adapter is served by its base's server with LoRA on):
- quality: the balanced evaluation set as batched greedy completions, exact-match graded;
- chat: a subset sent as chat messages, so the chat template is exercised;
- latency: streamed completions of fixed length at a fixed concurrency (real TTFT and TPOT).
Records go to ``ZOO/eval/<revision>.jsonl`` (quality), ``.chat.jsonl`` and ``.latency.jsonl``;
the summary to ``ZOO/eval/summary.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from revgate.evaluation.records import RequestRecord
from revgate.evaluation.reference_task import (
    MAX_ANSWER_CHARS,
    Example,
    accuracy_by_slice,
    balanced_examples,
    is_correct,
)
from revgate.manifests.revision import ExecutionConfig
from revgate.registry.runtime import LOCK_NAME
from revgate.serving.worker import engine as engine_module
from revgate.serving.worker.engine import EngineProcess, LoraModule, engine_python, serve
from revgate.zoo import measure
from revgate.zoo.files import json_bytes
from revgate.zoo.index import ZooRevision, folder_lock, load_revisions, read_index
from revgate.zoo.measure import chat_records, latency_records, paired_tpot_ratio, quality_records

EVAL_SEED = 4242
EVAL_DIR = "eval"
SUMMARY_FILE = "summary.json"
DEFAULT_PER_SLICE = 300
QUALITY_MAX_TOKENS = MAX_ANSWER_CHARS + 2
LATENCY_MAX_TOKENS = 16
LATENCY_CONCURRENCY = 4
LATENCY_REQUESTS = 64
CHAT_PER_SLICE = 20
PAIRED_PER_SLICE = 4
# The code that decides the measurements (the zoo's build key covers the weights); the engine build
# is covered by its lock. A change to any of them measures the zoo again.
EVAL_SOURCES = (Path(__file__), Path(str(measure.__file__)), Path(str(engine_module.__file__)))
# The zoo is served as it was trained: float32, eager, a short context, LoRA rank 8 available.
ZOO_EXECUTION = ExecutionConfig.build(
    dtype="float32", max_model_len=64, enforce_eager=True, enable_lora=True, max_lora_rank=8
)


@dataclass(frozen=True, slots=True)
class SliceAccuracy:
    """Exact-match accuracy of one slice with its Wilson 95% interval."""

    correct: int
    total: int
    low: float
    high: float

    @property
    def accuracy(self) -> float:
        """Share correct."""
        return self.correct / self.total if self.total else math.nan


@dataclass(frozen=True, slots=True)
class RevisionReport:
    """What ``models eval`` measured for one revision."""

    revision: str
    slices: dict[str, SliceAccuracy]
    overall: SliceAccuracy
    chat_accuracy: float
    tokens_per_s: float
    ttft_p50_ms: float
    tpot_p50_ms: float
    cpu_ms_per_token: float
    tpot_ratio_vs_stable: float


def wilson(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95% for z = 1.96); (0, 1) when total is 0."""
    if total == 0:
        return 0.0, 1.0
    share = correct / total
    centre = (share + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    # At 0 and at total the exact bound is 0 or 1; rounding would leave it a hair inside.
    low = 0.0 if correct == 0 else max(0.0, centre - half)
    high = 1.0 if correct == total else min(1.0, centre + half)
    return low, high


def slice_accuracy(correct: int, total: int) -> SliceAccuracy:
    """Counts with their Wilson interval."""
    low, high = wilson(correct, total)
    return SliceAccuracy(correct, total, low, high)


def grade(records: Sequence[RequestRecord]) -> tuple[dict[str, SliceAccuracy], SliceAccuracy]:
    """Per task slice and overall exact-match accuracy of graded records."""
    graded = [
        (f"{r.slices['family']}/{r.slices['length']}", is_correct(r.output_text, r.reference or "")) for r in records
    ]
    slices = {name: slice_accuracy(*counts) for name, counts in accuracy_by_slice(graded).items()}
    correct = sum(ok for _, ok in graded)
    return slices, slice_accuracy(correct, len(graded))


def eval_set(per_slice: int, seed: int = EVAL_SEED) -> list[Example]:
    """The balanced evaluation set."""
    return balanced_examples(seed, per_slice)


def subset(examples: Sequence[Example], per_slice: int) -> list[Example]:
    """The first ``per_slice`` examples of each task slice."""
    taken: dict[str, int] = {}
    chosen = []
    for example in examples:
        if taken.get(example.task_slice, 0) < per_slice:
            taken[example.task_slice] = taken.get(example.task_slice, 0) + 1
            chosen.append(example)
    return chosen


def measure_served(
    url: str,
    model: str,
    revision: str,
    examples: Sequence[Example],
    *,
    out: Path,
    cpu_seconds: Callable[[], float],
    reference: tuple[str, str],
) -> RevisionReport:
    """Quality, chat and latency of one served model name; writes its record files under ``out``.

    ``cpu_seconds`` reads the engine's CPU time; ``reference`` is stable's ``(url, model)``, served
    at the same time, for a per-token latency ratio measured side by side.
    """
    quality = quality_records(url, model, revision, examples, QUALITY_MAX_TOKENS)
    chats = chat_records(url, model, revision, subset(examples, CHAT_PER_SLICE), QUALITY_MAX_TOKENS)
    prompts = [examples[i % len(examples)] for i in range(0, len(examples), max(1, len(examples) // LATENCY_REQUESTS))]
    cpu_before = cpu_seconds()
    timed, wall = latency_records(
        url, model, revision, prompts[:LATENCY_REQUESTS], max_tokens=LATENCY_MAX_TOKENS, concurrency=LATENCY_CONCURRENCY
    )
    cpu_used = cpu_seconds() - cpu_before
    for suffix, records in ((".jsonl", quality), (".chat.jsonl", chats), (".latency.jsonl", timed)):
        write_records(out / f"{revision}{suffix}", records)
    slices, overall = grade(quality)
    _, chat_overall = grade(chats)
    return RevisionReport(
        revision=revision,
        slices=slices,
        overall=overall,
        chat_accuracy=chat_overall.accuracy,
        tokens_per_s=_tokens(timed) / wall,
        ttft_p50_ms=1000 * statistics.median(r.ttft_s for r in timed if r.ttft_s is not None),
        tpot_p50_ms=1000 * statistics.median(r.tpot_s for r in timed if r.tpot_s is not None),
        cpu_ms_per_token=1000 * cpu_used / max(1, _tokens(timed)),
        tpot_ratio_vs_stable=paired_tpot_ratio(
            url, model, reference, [e.prompt for e in subset(examples, PAIRED_PER_SLICE)], LATENCY_MAX_TOKENS
        ),
    )


def _tokens(records: Sequence[RequestRecord]) -> int:
    return sum(record.output_tokens or 0 for record in records)


def write_records(path: Path, records: Sequence[RequestRecord]) -> None:
    """JSON lines, written to a temporary name and renamed into place."""
    staging = path.with_name(path.name + ".partial")
    staging.write_text("".join(record.to_json() + "\n" for record in records))
    staging.replace(path)


def read_records(path: Path) -> list[RequestRecord]:
    """The records of one file written by :func:`write_records`."""
    return [RequestRecord.from_json(line) for line in path.read_text().splitlines() if line]


def evaluate_zoo(
    zoo_dir: Path, per_slice: int, names: Sequence[str] = (), log: Callable[[str], None] = print
) -> dict[str, RevisionReport]:
    """Serve each full-model revision in turn (adapters ride on their base's server) and measure it."""
    read_index(zoo_dir)  # a clear error, and nothing created, when there is no zoo
    with folder_lock(zoo_dir / EVAL_DIR):
        return _evaluate(zoo_dir, per_slice, names, log)


def _evaluate(
    zoo_dir: Path, per_slice: int, names: Sequence[str], log: Callable[[str], None]
) -> dict[str, RevisionReport]:
    revisions = load_revisions(zoo_dir)
    wanted = set(names or revisions)
    examples = eval_set(per_slice)
    out = zoo_dir / EVAL_DIR
    out.mkdir(exist_ok=True)
    reports: dict[str, RevisionReport] = {}
    with contextlib.ExitStack() as keep:
        reference: tuple[str, str] | None = None
        for revision in revisions.values():
            adapters = [
                r for r in revisions.values() if r.parent == revision.name and r.kind == "adapter" and r.name in wanted
            ]
            measure = revision.name in wanted or bool(adapters)
            # The first full model (stable) is served even when not measured: it is the side-by-side
            # baseline of every TPOT ratio, and stays up while the others are measured.
            if revision.kind == "adapter" or (reference is not None and not measure):
                continue
            engine = _engine(zoo_dir, revision, adapters, out)
            with contextlib.ExitStack() as this:
                (keep if reference is None else this).enter_context(engine)
                engine.wait_healthy()
                reference = reference or (engine.url, revision.name)
                if measure:
                    served = [revision.name, *(adapter.name for adapter in adapters)]
                    reports |= _measure_engine(engine, served, examples, out=out, log=log, reference=reference)
    write_summary(out / SUMMARY_FILE, reports, per_slice, evaluation_key(zoo_dir))
    return reports


def engine_lock() -> Path:
    """The engine environment's lock file, whose bytes identify the engine build."""
    return engine_python().parent.parent / LOCK_NAME


def evaluation_key(zoo_dir: Path, sources: Sequence[Path] = EVAL_SOURCES, lock: Path | None = None) -> str:
    """Digest over the zoo's build key, the evaluation and serving code, and the engine lock."""
    digest = hashlib.sha256(str(read_index(zoo_dir)["cache_key"]).encode())
    for source in sources:
        digest.update(source.read_bytes())
    lock = lock or engine_lock()
    digest.update(lock.read_bytes() if lock.exists() else b"no engine lock")
    return "sha256:" + digest.hexdigest()


def evaluated_zoo(zoo_dir: Path, per_slice: int, log: Callable[[str], None] = print) -> dict[str, RevisionReport]:
    """The zoo's measurements: reused when made for this zoo build and evaluation size, else measured.

    One evaluator at a time per zoo: concurrent test runs wait and then reuse its results.
    """
    read_index(zoo_dir)
    with folder_lock(zoo_dir / EVAL_DIR):
        reports = load_summary(zoo_dir, per_slice)
        if reports is not None:
            log(f"zoo eval: reusing {zoo_dir / EVAL_DIR}")
            return reports
        return _evaluate(zoo_dir, per_slice, (), log)


def load_summary(zoo_dir: Path, per_slice: int) -> dict[str, RevisionReport] | None:
    """The summary of a complete evaluation of this zoo build at ``per_slice``, or None."""
    path = zoo_dir / EVAL_DIR / SUMMARY_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    current = data.get("cache_key") == evaluation_key(zoo_dir) and data.get("per_slice") == per_slice
    if not current or set(data["revisions"]) != set(load_revisions(zoo_dir)):
        return None
    try:
        return {name: _report_from_dict(data["revisions"][name]) for name in load_revisions(zoo_dir)}
    except (KeyError, TypeError):
        return None  # written by an older version of this module: measure again


def _report_from_dict(data: dict[str, Any]) -> RevisionReport:
    # Intervals are recomputed from the counts, so a fix to wilson() applies to stored summaries too.
    slices = {name: slice_accuracy(acc["correct"], acc["total"]) for name, acc in data["slices"].items()}
    overall = slice_accuracy(data["overall"]["correct"], data["overall"]["total"])
    return RevisionReport(**{**data, "slices": slices, "overall": overall})


def _engine(zoo_dir: Path, revision: ZooRevision, adapters: Sequence[ZooRevision], out: Path) -> EngineProcess:
    loras = [LoraModule(adapter.name, zoo_dir / adapter.path) for adapter in adapters]
    log_path = out / f"{revision.name}.engine.log"
    return serve(zoo_dir / revision.path, ZOO_EXECUTION, revision.name, lora_modules=loras, log_path=log_path)


def _measure_engine(
    engine: EngineProcess,
    names: Sequence[str],
    examples: Sequence[Example],
    *,
    out: Path,
    log: Callable[[str], None],
    reference: tuple[str, str],
) -> dict[str, RevisionReport]:
    reports = {}
    for name in names:
        reports[name] = measure_served(
            engine.url, name, name, examples, out=out, cpu_seconds=engine.cpu_seconds, reference=reference
        )
        log(format_report(reports[name]))
    return reports


def write_summary(path: Path, reports: dict[str, RevisionReport], per_slice: int, cache_key: str) -> None:
    """The measured table as JSON (rates as numbers: this is evidence, not a canonical document)."""
    data = {
        "cache_key": cache_key,
        "per_slice": per_slice,
        "eval_seed": EVAL_SEED,
        "revisions": {name: asdict(report) for name, report in reports.items()},
    }
    staging = path.with_name(path.name + ".partial")
    staging.write_bytes(json_bytes(data))
    staging.replace(path)


def format_report(report: RevisionReport) -> str:
    """One line per revision: overall and per-slice accuracy with intervals, then speed."""

    def pct(acc: SliceAccuracy) -> str:
        return f"{100 * acc.accuracy:5.1f} [{100 * acc.low:4.1f}, {100 * acc.high:5.1f}]"

    lines = [
        f"{report.revision}: overall {pct(report.overall)}  chat {100 * report.chat_accuracy:5.1f}%  "
        f"{report.tokens_per_s:6.0f} tok/s  TTFT p50 {report.ttft_p50_ms:5.1f} ms  "
        f"TPOT p50 {report.tpot_p50_ms:5.1f} ms  CPU {report.cpu_ms_per_token:5.2f} ms/token  "
        f"TPOT vs stable, side by side {report.tpot_ratio_vs_stable:4.2f}x"
    ]
    lines += [f"    {name:<11} {pct(acc)}" for name, acc in report.slices.items()]
    return "\n".join(lines)


def markdown_table(reports: dict[str, RevisionReport]) -> str:
    """The docs table: accuracy per slice with 95% intervals, chat accuracy, speed."""
    slice_names = sorted({name for report in reports.values() for name in report.slices})
    header = [
        "revision",
        "overall",
        *slice_names,
        "chat",
        "tok/s",
        "TTFT p50 ms",
        "TPOT p50 ms",
        "CPU ms/token",
        "TPOT / stable's, side by side",
    ]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for report in reports.values():
        cells = [report.revision, _cell(report.overall)]
        cells += [_cell(report.slices[name]) for name in slice_names]
        cells += [
            f"{100 * report.chat_accuracy:.1f}",
            f"{report.tokens_per_s:.0f}",
            f"{report.ttft_p50_ms:.1f}",
            f"{report.tpot_p50_ms:.2f}",
            f"{report.cpu_ms_per_token:.2f}",
            f"{report.tpot_ratio_vs_stable:.2f}",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _cell(acc: SliceAccuracy) -> str:
    return f"{100 * acc.accuracy:.1f} [{100 * acc.low:.1f}, {100 * acc.high:.1f}]"
