"""Pure parts of verification: signature vs manifest, file-set checks."""

from __future__ import annotations

import pytest

from revgate.manifests.artifact import ArtifactManifest
from revgate.registry.errors import MissingFile, UnexpectedFile
from revgate.registry.verify import check_file_set, signature_disagreement

A, B = "aa" * 32, "bb" * 32
MANIFEST = ArtifactManifest.build(entries=[
    {"path": "config.json", "size": 1, "sha256": A, "role": "config"},
    {"path": "w.safetensors", "size": 1, "sha256": B, "role": "weights"},
])


def test_identical_signed_list_agrees() -> None:
    assert signature_disagreement({"config.json": A, "w.safetensors": B}, MANIFEST) is None


def test_disagreements_are_named_per_file() -> None:
    problem = signature_disagreement({"config.json": B, "other": A}, MANIFEST)
    assert problem == "only signed: other; only in manifest: w.safetensors; digest differs: config.json"


def test_missing_and_unexpected_files() -> None:
    expected = {"config.json": A, "w.safetensors": B}
    check_file_set(("config.json", "w.safetensors"), expected)
    with pytest.raises(MissingFile) as missing:
        check_file_set(("config.json", "w2.safetensors"), expected)
    assert missing.value.where == "w.safetensors" and "renamed" in str(missing.value)
    with pytest.raises(UnexpectedFile) as extra:
        check_file_set(("config.json", "w.safetensors", "x"), expected)
    assert extra.value.where == "x"
