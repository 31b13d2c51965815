"""Traces: a JSON-lines format for open-loop traffic, and a generator for the reference task.

One line per request::

    {"request_id": "t-000001", "offset_s": 0.0132, "endpoint": "/v1/completions",
     "body": {"prompt": "add 3+4=", "max_tokens": 9, ...}, "slices": {"family": "add", ...},
     "tenant": "tenant-a", "reference": "7"}

``offset_s`` is the intended send time from the start of the replay; ``reference`` is present only
on labelled requests. The replay fills in ``model`` and ``stream`` when the body leaves them out.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from revgate.evaluation import reference_task
from revgate.manifests.errors import RevgateError

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
Arrivals = Literal["poisson", "bursty"]


class TraceInvalid(RevgateError):
    """A trace file is malformed; nothing was replayed."""


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One request of a trace."""

    request_id: str
    offset_s: float
    body: dict[str, Any]
    endpoint: str = "/v1/completions"
    slices: dict[str, str] = field(default_factory=dict)
    tenant: str = ""
    reference: str | None = None

    def to_json(self) -> str:
        """One JSON line."""
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)


def parse_entry(line: str, where: str) -> TraceEntry:
    """Parse and check one trace line; a :class:`TraceInvalid` names the line and the problem."""
    try:
        data = json.loads(line)
        entry = TraceEntry(**data)
    except (json.JSONDecodeError, TypeError) as error:
        raise TraceInvalid(
            f"not a trace entry: {error}", where=where, fix="Each line must be one JSON trace entry."
        ) from None
    problem = _problem(entry)
    if problem:
        raise TraceInvalid(problem, where=where, fix="Correct the entry; nothing was replayed.")
    return entry


def _problem(entry: TraceEntry) -> str:
    if not isinstance(entry.offset_s, (int, float)) or not math.isfinite(entry.offset_s) or entry.offset_s < 0:
        return f"offset_s must be a finite number >= 0, got {entry.offset_s!r}"
    if entry.endpoint not in ENDPOINTS:
        return f"endpoint must be one of {ENDPOINTS}, got {entry.endpoint!r}"
    if not isinstance(entry.body, dict):
        return "body must be a JSON object"
    if not isinstance(entry.slices, dict) or not all(isinstance(v, str) for v in entry.slices.values()):
        return "slices must map labels to strings"
    return ""


def read_trace(path: Path) -> list[TraceEntry]:
    """All entries of a trace, sorted by offset; duplicate request ids are refused."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise TraceInvalid(
            f"cannot read the trace: {error.strerror}", where=str(path), fix="Give an existing trace file."
        ) from None
    entries = [parse_entry(line, f"{path}:{number}") for number, line in enumerate(lines, 1) if line.strip()]
    seen: set[str] = set()
    for entry in entries:
        if entry.request_id in seen:
            raise TraceInvalid(
                f"request_id {entry.request_id!r} appears twice", where=str(path), fix="Make request ids unique."
            )
        seen.add(entry.request_id)
    return sorted(entries, key=lambda e: e.offset_s)


def write_trace(entries: Iterable[TraceEntry], path: Path) -> None:
    """Write a trace atomically (temporary name, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(entry.to_json() + "\n" for entry in entries), encoding="utf-8")
    tmp.replace(path)


def arrival_offsets(
    rng: random.Random,
    n: int,
    rate: float,
    arrivals: Arrivals,
    *,
    burst_factor: float = 5.0,
    burst_share: float = 0.2,
    cycle_requests: float = 40.0,
) -> list[float]:
    """Send times for ``n`` requests at mean ``rate`` per second.

    Poisson: exponential gaps. Bursty: a two-state Markov-modulated Poisson process that spends
    ``burst_share`` of its time at ``burst_factor`` times the quiet rate, with the same mean rate;
    one quiet-plus-burst cycle lasts about ``cycle_requests`` requests.
    """
    if rate <= 0 or n < 0:
        raise TraceInvalid(f"rate must be > 0 and n >= 0, got rate={rate}, n={n}", fix="Give a positive rate.")
    if arrivals == "poisson":
        return _poisson(rng, n, rate)
    quiet = rate / (1 - burst_share + burst_share * burst_factor)
    cycle_s = cycle_requests / rate
    mean_stay = {False: cycle_s * (1 - burst_share), True: cycle_s * burst_share}
    offsets: list[float] = []
    clock, in_burst = 0.0, False
    stay = rng.expovariate(1 / mean_stay[in_burst])
    while len(offsets) < n:
        gap = rng.expovariate(quiet * burst_factor if in_burst else quiet)
        if gap < stay:  # memoryless: a gap cut short by a state switch is simply redrawn
            clock, stay = clock + gap, stay - gap
            offsets.append(round(clock, 6))
        else:
            clock, in_burst = clock + stay, not in_burst
            stay = rng.expovariate(1 / mean_stay[in_burst])
    return offsets


def _poisson(rng: random.Random, n: int, rate: float) -> list[float]:
    offsets, clock = [], 0.0
    for _ in range(n):
        clock += rng.expovariate(rate)
        offsets.append(round(clock, 6))
    return offsets


def generate_trace(
    n: int,
    rate: float,
    *,
    seed: int = 0,
    arrivals: Arrivals = "poisson",
    mix: Mapping[str, float] | None = None,
    labelled_fraction: float = 1.0,
    max_tokens: int = reference_task.MAX_ANSWER_CHARS + 2,
) -> list[TraceEntry]:
    """A reference-task trace: prompts and slices from :mod:`evaluation.reference_task`.

    ``mix`` weights the task slices (family x length bucket, so it sets the length distribution);
    ``labelled_fraction`` of the requests carry their reference answer.
    """
    if not 0.0 <= labelled_fraction <= 1.0:
        raise TraceInvalid(f"labelled_fraction must be in [0, 1], got {labelled_fraction}", fix="Give a fraction.")
    rng = random.Random(seed)  # noqa: S311 - reproducible traffic, not secrets
    try:
        examples = reference_task.examples(seed, n, mix)
    except ValueError as error:
        raise TraceInvalid(str(error), where="mix", fix="Use the reference task's slice names.") from None
    offsets = arrival_offsets(rng, n, rate, arrivals)
    return [
        TraceEntry(
            request_id=f"t{seed}-{index:06d}",
            offset_s=offset,
            body={"prompt": example.prompt, "max_tokens": max_tokens, "temperature": 0},
            slices=dict(example.slices),
            tenant=example.slices.get("tenant", ""),
            reference=example.answer if rng.random() < labelled_fraction else None,
        )
        for index, (example, offset) in enumerate(zip(examples, offsets, strict=True))
    ]
