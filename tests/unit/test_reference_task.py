"""The reference task: deterministic examples, correct references, exact-match grading."""

from __future__ import annotations

from collections import Counter

import pytest

from revgate.evaluation.reference_task import (
    SLICE_KEYS,
    TASK_SLICES,
    accuracy_by_slice,
    balanced_examples,
    examples,
    is_correct,
    reference_answer,
)


def test_same_seed_same_examples_and_different_seed_differs() -> None:
    assert examples(7, 200) == examples(7, 200)
    assert examples(7, 200) != examples(8, 200)


def test_every_answer_is_the_reference_answer_of_its_prompt() -> None:
    for example in examples(1, 600):
        assert reference_answer(example.prompt) == example.answer
        assert set(example.slices) == set(SLICE_KEYS)
        assert example.prompt.endswith("=")


def test_answers_follow_the_family_rule() -> None:
    assert reference_answer("add 12+7=") == "19"
    assert reference_answer("rev abc=") == "cba"
    assert reference_answer("sort 3120=") == "0123"


def test_length_buckets_separate_short_from_long_operands() -> None:
    for example in examples(3, 600):
        body = example.prompt.split(" ", 1)[1][:-1]
        size = max(len(part) for part in body.split("+"))
        if example.slices["family"] == "add":
            assert size == (2 if example.slices["length"] == "long" else 1)
        else:
            assert (size >= 5) == (example.slices["length"] == "long")


def test_mix_down_weights_a_slice() -> None:
    counts = Counter(example.task_slice for example in examples(5, 6000, {"sort/long": 0.1}))
    assert counts["sort/long"] < counts["sort/short"] / 5
    assert set(counts) == set(TASK_SLICES)


def test_zero_weight_removes_a_slice_and_bad_mix_is_refused() -> None:
    assert all(ex.task_slice != "rev/long" for ex in examples(5, 500, {"rev/long": 0.0}))
    with pytest.raises(ValueError, match="unknown task slices"):
        examples(5, 10, {"french/long": 1.0})
    with pytest.raises(ValueError, match="non-negative"):
        examples(5, 10, {"add/short": -1.0})


def test_balanced_examples_cover_each_slice_equally() -> None:
    counts = Counter(example.task_slice for example in balanced_examples(11, 25))
    assert counts == dict.fromkeys(TASK_SLICES, 25)


def test_exact_match_ignores_trailing_text_after_newline_and_spaces_only() -> None:
    assert is_correct(" 19\nadd", "19")
    assert not is_correct("190", "19")
    assert not is_correct(None, "19")
    assert not is_correct("", "19")


def test_accuracy_by_slice_counts() -> None:
    assert accuracy_by_slice([("a", True), ("a", False), ("b", True)]) == {"a": (1, 2), "b": (1, 1)}


def test_malformed_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="not a reference-task prompt"):
        reference_answer("mul 2*3=")
