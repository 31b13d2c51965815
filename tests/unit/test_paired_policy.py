"""The gate policy's paired and slicing sections: optional, validated, and invisible while unset."""

from __future__ import annotations

import pytest

from revgate.manifests.errors import ManifestInvalid
from revgate.manifests.gates import GatePolicy


def test_a_policy_without_the_new_sections_keeps_its_canonical_form() -> None:
    plain = GatePolicy.build(slice_keys=["family"])
    assert b"paired" not in plain.canonical() and b"slicing" not in plain.canonical()
    assert plain.paired is None and plain.slicing is None
    assert GatePolicy.from_json(plain.canonical()).digest == plain.digest


def test_paired_and_slicing_sections_round_trip() -> None:
    policy = GatePolicy.build(
        paired={
            "quality_margin": "0.03",
            "latency_margin": "0.6",
            "graders": [
                {"name": "json", "kind": "json-schema", "json_schema": {"type": "object"}, "slices": ["task=extract"]},
                {"name": "judge", "kind": "judge-pairwise", "rubric": "Which answer is more correct?"},
                {"name": "length", "kind": "length-ratio", "min_ratio": "0.5", "max_ratio": "2"},
            ],
        },
        slicing={"rules": [{"slice": "extract", "task": "extract"}, {"slice": "long", "prompt_length": "long"}]},
    )
    again = GatePolicy.from_json(policy.canonical())
    assert again == policy and again.digest == policy.digest
    assert policy.paired is not None and str(policy.paired.latency_margin) == "0.6"


@pytest.mark.parametrize(
    ("paired", "named"),
    [
        ({"graders": [{"name": "j", "kind": "judge-pairwise"}]}, "needs rubric"),
        ({"graders": [{"name": "r", "kind": "regex"}]}, "needs pattern"),
        ({"graders": [{"name": "r", "kind": "regex", "pattern": "(unclosed"}]}, "does not compile"),
        ({"graders": [{"name": "l", "kind": "length-ratio", "min_ratio": "2", "max_ratio": "1"}]}, "min_ratio"),
        ({"graders": [{"name": "s", "kind": "json-schema", "json_schema": {"maximum": 0.5}}]}, "float"),
        ({"graders": [{"name": "Bad Name", "kind": "not-empty"}]}, "name"),
        ({"graders": [{"name": "a", "kind": "not-empty"}, {"name": "a", "kind": "not-refusal"}]}, "share a name"),
        ({"look_every": 500, "max_pairs_per_stage": 100}, "look_every"),
        ({"look_every": 50, "max_pairs_per_stage": 100, "latency_max_pairs_per_stage": 40},
         "latency_max_pairs_per_stage"),
        ({"latency_margin": "-0.1"}, "latency_margin"),
    ],
)
def test_a_bad_paired_section_is_refused_with_the_problem_named(paired: dict[str, object], named: str) -> None:
    with pytest.raises(ManifestInvalid, match=named):
        GatePolicy.build(paired=paired)


def test_a_slicing_rule_may_not_take_the_reserved_unmatched_name() -> None:
    with pytest.raises(ManifestInvalid, match="reserved"):
        GatePolicy.build(slicing={"rules": [{"slice": "unmatched", "tenant": "a"}]})


def test_a_critical_slice_no_paired_grader_feeds_is_refused() -> None:
    graders = [{"name": "json", "kind": "json-schema", "json_schema": {"type": "object"}, "slices": ["extract"]}]
    with pytest.raises(ManifestInvalid, match="critical slices chat"):
        GatePolicy.build(critical_slices=["extract", "chat"], paired={"graders": graders})
    wide = [*graders, {"name": "judge", "kind": "judge-pairwise", "rubric": "r"}]
    assert GatePolicy.build(critical_slices=["extract", "chat"], paired={"graders": wide}).paired is not None
