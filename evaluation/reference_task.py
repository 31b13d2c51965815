"""The reference task: a synthetic task with ground-truth answers and natural slices.

Three task families stand in for "languages", operand length stands in for the input-length
bucket, and a tenant label rides along on the traffic:

- ``add a+b=``         -> the decimal sum            (short: one-digit operands, long: two-digit)
- ``rev <letters>=``   -> the letters reversed        (short: 2-4 letters, long: 5-7 letters)
- ``sort <digits>=``   -> the digits in ascending order (short: 2-4 digits, long: 5-7 digits)

Generation is deterministic from a seed (``random.Random``, no global state), so a trace, a
training set and an evaluation set are reproducible byte for byte. Pure: no torch, no scipy.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

FAMILIES: tuple[str, ...] = ("add", "rev", "sort")
LENGTHS: tuple[str, ...] = ("short", "long")
TENANTS: tuple[str, ...] = ("tenant-a", "tenant-b")
SLICE_KEYS: tuple[str, ...] = ("family", "length", "tenant")
# A task slice is family x length bucket ("add/short"); the tenant is a traffic label, not a skill.
TASK_SLICES: tuple[str, ...] = tuple(f"{family}/{length}" for family in FAMILIES for length in LENGTHS)
# Longest answer any example has, in characters (= byte tokens), for max_tokens with headroom.
MAX_ANSWER_CHARS = 7


@dataclass(frozen=True, slots=True)
class Example:
    """One prompt with its reference answer and slice labels (keys: :data:`SLICE_KEYS`)."""

    prompt: str
    answer: str
    slices: dict[str, str] = field(default_factory=dict)

    @property
    def task_slice(self) -> str:
        """``family/length``, the slice the quality gates compare per task."""
        return f"{self.slices['family']}/{self.slices['length']}"


def _add(rng: random.Random, long: bool) -> tuple[str, str]:
    low, high = (10, 99) if long else (0, 9)
    a, b = rng.randint(low, high), rng.randint(low, high)
    return f"add {a}+{b}=", str(a + b)


def _rev(rng: random.Random, long: bool) -> tuple[str, str]:
    letters = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(5, 7) if long else rng.randint(2, 4)))
    return f"rev {letters}=", letters[::-1]


def _sort(rng: random.Random, long: bool) -> tuple[str, str]:
    digits = "".join(rng.choices(string.digits, k=rng.randint(5, 7) if long else rng.randint(2, 4)))
    return f"sort {digits}=", "".join(sorted(digits))


_GENERATORS: dict[str, Callable[[random.Random, bool], tuple[str, str]]] = {
    "add": _add,
    "rev": _rev,
    "sort": _sort,
}


def make_example(rng: random.Random, task_slice: str) -> Example:
    """One example of ``task_slice`` (``family/length``) drawn from ``rng``, with a tenant label."""
    family, length = _split_slice(task_slice)
    prompt, answer = _GENERATORS[family](rng, length == "long")
    tenant = rng.choice(TENANTS)
    return Example(prompt, answer, {"family": family, "length": length, "tenant": tenant})


def examples(seed: int, n: int, mix: Mapping[str, float] | None = None) -> list[Example]:
    """``n`` examples from ``seed``; slices drawn with the relative weights in ``mix`` (default: uniform).

    ``mix`` maps task slices (``"sort/long"``) to non-negative weights; slices it omits weigh 1.
    """
    weights = slice_weights(mix)
    rng = random.Random(seed)  # noqa: S311 - reproducible task data, not secrets
    chosen = rng.choices(TASK_SLICES, weights=weights, k=n)
    return [make_example(rng, task_slice) for task_slice in chosen]


def balanced_examples(seed: int, per_slice: int) -> list[Example]:
    """``per_slice`` examples of every task slice, slice-major: the evaluation set."""
    rng = random.Random(seed)  # noqa: S311 - reproducible task data, not secrets
    return [make_example(rng, task_slice) for task_slice in TASK_SLICES for _ in range(per_slice)]


def slice_weights(mix: Mapping[str, float] | None) -> list[float]:
    """Weights in :data:`TASK_SLICES` order; unknown slices or negative weights are refused."""
    mix = dict(mix or {})
    unknown = sorted(set(mix) - set(TASK_SLICES))
    if unknown:
        raise ValueError(f"unknown task slices {unknown}; known: {list(TASK_SLICES)}")
    weights = [float(mix.get(task_slice, 1.0)) for task_slice in TASK_SLICES]
    if any(weight < 0 for weight in weights) or not any(weights):
        raise ValueError("slice weights must be non-negative and not all zero")
    return weights


def normalise_output(text: str) -> str:
    """What exact match compares: the completion up to its first newline, without surrounding spaces."""
    return text.split("\n", 1)[0].strip()


def is_correct(output_text: str | None, answer: str) -> bool:
    """Exact match of the model's completion against the reference answer."""
    return output_text is not None and normalise_output(output_text) == answer


def reference_answer(prompt: str) -> str:
    """The ground-truth answer of any well-formed reference-task prompt (``add 3+4=`` -> ``7``)."""
    family, _, body = prompt.partition(" ")
    if not body.endswith("=") or family not in _SOLVERS:
        raise ValueError(f"not a reference-task prompt: {prompt!r}")
    return _SOLVERS[family](body[:-1])


def _solve_add(body: str) -> str:
    a, _, b = body.partition("+")
    return str(int(a) + int(b))


_SOLVERS: dict[str, Callable[[str], str]] = {
    "add": _solve_add,
    "rev": lambda body: body[::-1],
    "sort": lambda body: "".join(sorted(body)),
}


def accuracy_by_slice(graded: Iterable[tuple[str, bool]]) -> dict[str, tuple[int, int]]:
    """(correct, total) per slice name from ``(slice, correct)`` pairs, slices sorted."""
    counts: dict[str, list[int]] = {}
    for task_slice, correct in graded:
        tally = counts.setdefault(task_slice, [0, 0])
        tally[0] += int(correct)
        tally[1] += 1
    return {name: (tally[0], tally[1]) for name, tally in sorted(counts.items())}


def _split_slice(task_slice: str) -> tuple[str, str]:
    family, _, length = task_slice.partition("/")
    if family not in FAMILIES or length not in LENGTHS:
        raise ValueError(f"unknown task slice {task_slice!r}; known: {list(TASK_SLICES)}")
    return family, length
