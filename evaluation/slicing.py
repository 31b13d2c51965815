"""Slices of live traffic: request features mapped to slice names by the policy's rules.

Users' requests carry no slice labels of the test's own making; what they carry is a route, a
tenant, perhaps a declared request class or task label, and a prompt length. The policy's
:class:`~manifests.gates.Slicing` rules map those features to slices (first matching rule wins).
A request that no rule matches goes to the ``unmatched`` slice, which the gates test like any
other, and its features are counted so a report can say which traffic the rules do not cover.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from revgate.evaluation.records import RequestRecord
from revgate.manifests.gates import PromptLength, SliceRule, Slicing


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What a live request says about itself, as far as slicing is concerned."""

    route: str
    tenant: str
    request_class: str | None
    task: str | None
    prompt_tokens: int | None

    def describe(self, slicing: Slicing) -> str:
        """A short key for reports: ``route=..,tenant=..,class=..,task=..,length=..`` (``?`` when unknown)."""
        length = prompt_length(self.prompt_tokens, slicing)
        parts = (
            ("route", self.route or "?"),
            ("tenant", self.tenant or "?"),
            ("class", self.request_class or "?"),
            ("task", self.task or "?"),
            ("length", length or "?"),
        )
        return ",".join(f"{key}={value}" for key, value in parts)


@dataclass(frozen=True, slots=True)
class SliceCensus:
    """Requests per slice, and the feature combinations that no rule matched with their counts."""

    counts: dict[str, int]
    unmatched: dict[str, int]

    @property
    def unmatched_requests(self) -> int:
        """How many requests fell outside every rule."""
        return sum(self.unmatched.values())


def features_of(record: RequestRecord, slicing: Slicing) -> RequestFeatures:
    """The features of a request record; class and task come from its declared labels."""
    return RequestFeatures(
        route=record.route,
        tenant=record.tenant,
        request_class=record.slices.get(slicing.class_key) or None,
        task=record.slices.get(slicing.task_key) or None,
        prompt_tokens=record.prompt_tokens,
    )


def prompt_length(tokens: int | None, slicing: Slicing) -> PromptLength | None:
    """The prompt length bucket (None when the token count is unknown)."""
    if tokens is None:
        return None
    if tokens < slicing.short_below:
        return "short"
    return "medium" if tokens < slicing.long_from else "long"


def matches(rule: SliceRule, features: RequestFeatures, slicing: Slicing) -> bool:
    """Every feature the rule sets equals the request's (an unknown feature never matches a set one)."""
    wanted = (
        (rule.route, features.route),
        (rule.tenant, features.tenant),
        (rule.request_class, features.request_class),
        (rule.task, features.task),
        (rule.prompt_length, prompt_length(features.prompt_tokens, slicing)),
    )
    return all(want is None or want == have for want, have in wanted)


def slice_of(features: RequestFeatures, slicing: Slicing) -> str:
    """The first matching rule's slice, or the policy's ``unmatched`` slice."""
    return next((rule.slice for rule in slicing.rules if matches(rule, features, slicing)), slicing.unmatched)


def record_slice(record: RequestRecord, slicing: Slicing) -> str:
    """The slice of one request record."""
    return slice_of(features_of(record, slicing), slicing)


def census(records: Iterable[RequestRecord], slicing: Slicing) -> SliceCensus:
    """Requests per slice and the unmatched feature combinations, for the report."""
    counts: Counter[str] = Counter()
    unmatched: Counter[str] = Counter()
    for record in records:
        features = features_of(record, slicing)
        name = slice_of(features, slicing)
        counts[name] += 1
        if name == slicing.unmatched:
            unmatched[features.describe(slicing)] += 1
    return SliceCensus(dict(counts), dict(unmatched))
