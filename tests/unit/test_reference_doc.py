"""docs/reference.md lists every field of the gate policy and the rollout plan with its default.

The reference is read by people writing policies and plans by hand: a field the code has and the
page lacks, or a default the page gets wrong, fails here with the field named.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from revgate.manifests.gates import (
    GatePolicy,
    HardConstraint,
    PairedGrader,
    PairedPolicy,
    SliceRule,
    Slicing,
    SloTarget,
)
from revgate.manifests.rollout import Analyze, Approve, Bake, PostPromotionCheck, RolloutPlan, SetWeight, Shadow

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
DOCUMENTS: tuple[type[BaseModel], ...] = (GatePolicy, SloTarget, HardConstraint, PairedPolicy, PairedGrader, Slicing,
                                          SliceRule, RolloutPlan, PostPromotionCheck)
STEPS: tuple[type[BaseModel], ...] = (Shadow, SetWeight, Bake, Analyze, Approve)
ROW = re.compile(r"^\| `([A-Za-z0-9_.]+)` \| (.+?) \| .+ \|$")


def tables() -> dict[str, dict[str, str]]:
    """Each ``### heading``'s table: field -> the default column as written."""
    found: dict[str, dict[str, str]] = {}
    section = ""
    for line in REFERENCE.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            section = line.removeprefix("### ").strip("` ")
            found[section] = {}
        elif (row := ROW.match(line)) and section:
            found[section][row.group(1)] = row.group(2)
    return found


def written_default(info: FieldInfo) -> str:
    """The default as the page writes it: canonical JSON in backticks, ``required``, or a nested document's name."""
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return f"`{type(value).__name__}`"
    dumped = None if value is None else TypeAdapter(info.annotation or object).dump_python(value, mode="json")
    return f"`{json.dumps(dumped, separators=(', ', ': '), ensure_ascii=False)}`"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda document: document.__name__)
def test_every_field_is_listed_with_its_default(document: type[BaseModel]) -> None:
    table = tables().get(document.__name__)
    assert table is not None, f"docs/reference.md has no '### `{document.__name__}`' section"
    missing = sorted(set(document.model_fields) - set(table))
    assert not missing, f"docs/reference.md, `{document.__name__}`: add rows for {missing}"
    unknown = sorted(set(table) - set(document.model_fields))
    assert not unknown, f"docs/reference.md, `{document.__name__}`: rows for fields the code lacks: {unknown}"
    for name, info in document.model_fields.items():
        assert table[name] == written_default(info), (
            f"docs/reference.md, `{document.__name__}.{name}`: default written {table[name]}, "
            f"the code's is {written_default(info)}")


def test_every_step_kind_and_field_is_listed() -> None:
    table = tables()["Steps"]
    expected = {f"{step.__name__}.{name}": info for step in STEPS for name, info in step.model_fields.items()}
    assert sorted(table) == sorted(expected), "docs/reference.md, Steps: rows differ from the step documents' fields"
    for name, info in expected.items():
        assert table[name] == written_default(info), f"docs/reference.md, Steps, `{name}`: default {table[name]}"
