"""Write-once, content-addressed stores: the local folder and S3 (a real moto S3 server)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from revgate.manifests.artifact import ArtifactManifest
from revgate.manifests.canonical import sha256_digest
from revgate.manifests.errors import NotCanonical
from revgate.registry.build import build_manifest
from revgate.registry.errors import (
    DigestMismatch,
    ObjectCorrupt,
    ObjectExists,
    ObjectMissing,
    StoreError,
    UnexpectedFile,
)
from revgate.registry.store import ArtifactStore, LocalBackend, blob_key, manifest_key, open_store


def _model(folder: Path, big: int = 0) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 128}')
    (folder / "sub").mkdir()
    (folder / "sub" / "model.safetensors").write_bytes(os.urandom(200_000))
    if big:
        (folder / "big.safetensors").write_bytes(os.urandom(big))
    return folder


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ArtifactStore]:
    if request.param == "local":
        yield open_store(str(tmp_path / "store"))
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"artifacts-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    # A small multipart threshold so the multipart path runs on test-sized files (S3's minimum part is 5 MiB).
    yield open_store(f"s3://{bucket}/team/models", endpoint_url=endpoint,
                     multipart_threshold=5 * 1024 * 1024, part_bytes=5 * 1024 * 1024)


pytestmark = pytest.mark.servers


def _push(store: ArtifactStore, model: Path, signature: Path | None = None) -> tuple[str, ArtifactManifest]:
    manifest = build_manifest(model)
    return store.push(model, manifest, signature), manifest


def test_push_then_pull_gives_identical_verified_files(store: ArtifactStore, tmp_path: Path) -> None:
    model = _model(tmp_path / "model", big=11 * 1024 * 1024)
    digest, manifest = _push(store, model)
    assert digest == manifest.digest
    assert store.get_manifest(digest) == manifest
    pulled = store.pull(digest, tmp_path / "cache" / "a")
    assert pulled == manifest
    for entry in manifest.entries:
        assert (tmp_path / "cache" / "a" / entry.path).read_bytes() == (model / entry.path).read_bytes()
    assert build_manifest(tmp_path / "cache" / "a") == manifest


def test_push_is_idempotent_and_objects_are_never_overwritten(store: ArtifactStore, tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    digest, manifest = _push(store, model)
    assert store.push(model, manifest) == digest
    key = blob_key(manifest.entries[0].sha256)
    assert store.backend.put_bytes(key, b"replacement") is False
    assert store.backend.get_bytes(key) == (model / manifest.entries[0].path).read_bytes()


def test_a_different_signature_is_not_published_over_the_first(store: ArtifactStore, tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    first, second = tmp_path / "a.sig", tmp_path / "b.sig"
    first.write_text('{"first": true}')
    second.write_text('{"second": true}')
    digest, manifest = _push(store, model, first)
    assert store.push(model, manifest, first) == digest
    with pytest.raises(ObjectExists):
        store.push(model, manifest, second)
    assert store.get_signature(digest) == first.read_bytes()


def test_push_refuses_a_folder_that_differs_from_its_manifest(store: ArtifactStore, tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    manifest = build_manifest(model)
    (model / "stray.txt").write_text("x")
    with pytest.raises(UnexpectedFile):
        store.push(model, manifest)
    with pytest.raises(ObjectMissing):
        store.get_manifest(manifest.digest)


def _corrupt(store: ArtifactStore, key: str) -> None:
    """Flip the stored object's last byte in place, as a broken disk or a bad actor would."""
    data = bytearray(store.backend.get_bytes(key))
    data[-1] ^= 0xFF
    if isinstance(store.backend, LocalBackend):
        path = store.backend.root / key
        path.chmod(0o644)
        path.write_bytes(bytes(data))
    else:
        backend = store.backend
        backend.client.put_object(Bucket=backend.bucket, Key=backend._key(key), Body=bytes(data))  # type: ignore[attr-defined]


def test_corrupt_blob_never_appears_under_the_final_name(store: ArtifactStore, tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    digest, manifest = _push(store, model)
    _corrupt(store, blob_key(manifest.by_path()["sub/model.safetensors"].sha256))
    dest = tmp_path / "cache" / "m"
    with pytest.raises(DigestMismatch, match=r"sub/model\.safetensors"):
        store.pull(digest, dest)
    assert not dest.exists()
    assert list((tmp_path / "cache").iterdir()) == []


def test_push_repairs_a_corrupt_blob_planted_before_it(store: ArtifactStore, tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    manifest = build_manifest(model)
    key = blob_key(manifest.by_path()["sub/model.safetensors"].sha256)
    corrupt = bytearray((model / "sub" / "model.safetensors").read_bytes())
    corrupt[-1] ^= 0xFF
    store.backend.put_bytes(key, bytes(corrupt))
    store.push(model, manifest)
    pulled = tmp_path / "pulled"
    store.pull(manifest.digest, pulled)
    assert (pulled / "sub" / "model.safetensors").read_bytes() == (model / "sub" / "model.safetensors").read_bytes()


def test_push_again_repairs_objects_corrupted_after_publication(store: ArtifactStore, tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    digest, manifest = _push(store, model)
    for entry in manifest.entries:
        _corrupt(store, blob_key(entry.sha256))
    _corrupt(store, manifest_key(digest))
    with pytest.raises(DigestMismatch):
        store.get_manifest(digest)
    assert store.push(model, manifest) == digest
    store.pull(digest, tmp_path / "pulled")
    assert build_manifest(tmp_path / "pulled") == manifest


def test_manifest_in_non_canonical_bytes_is_refused(store: ArtifactStore, tmp_path: Path) -> None:
    manifest = build_manifest(_model(tmp_path / "model"))
    pretty = manifest.model_dump_json(indent=2).encode()  # the same manifest, other bytes: another digest
    alias = sha256_digest(pretty)
    store.backend.put_bytes(manifest_key(alias), pretty)
    with pytest.raises(NotCanonical, match="canonical form"):
        store.get_manifest(alias)
    with pytest.raises(NotCanonical):
        store.pull(alias, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_manifest_bytes_are_checked_against_the_digest(store: ArtifactStore, tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    manifest = build_manifest(model)
    other = build_manifest(_model(tmp_path / "other"))
    store.backend.put_bytes(manifest_key(manifest.digest), other.canonical())
    with pytest.raises(DigestMismatch):
        store.get_manifest(manifest.digest)


def test_pull_of_unknown_digest_or_into_existing_folder(store: ArtifactStore, tmp_path: Path) -> None:
    with pytest.raises(ObjectMissing):
        store.pull("sha256:" + "12" * 32, tmp_path / "x")
    digest, _ = _push(store, _model(tmp_path / "model"))
    (tmp_path / "taken").mkdir()
    with pytest.raises(StoreError, match="already exists"):
        store.pull(digest, tmp_path / "taken")
    with pytest.raises(StoreError, match="not a manifest digest"):
        store.get_manifest("latest")


def test_store_urls() -> None:
    with pytest.raises(StoreError, match="unsupported store scheme"):
        open_store("ftp://host/x")
    with pytest.raises(StoreError, match="malformed S3 URL"):
        open_store("s3://UPPER/x")


class _DiskThatKeepsBadBytes(LocalBackend):
    """A folder whose replacements do not take, as on a failing disk."""

    def replace_file(self, key: str, path: Path, version: str) -> bool:
        return True


def test_a_repair_that_does_not_take_is_a_typed_error(tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    manifest = build_manifest(model)
    store = ArtifactStore(_DiskThatKeepsBadBytes(tmp_path / "store"))
    key = blob_key(manifest.by_path()["config.json"].sha256)
    store.backend.put_bytes(key, b"not the config")
    with pytest.raises(ObjectCorrupt, match="could not be replaced") as caught:
        store.push(model, manifest)
    assert key in caught.value.where
    with pytest.raises(ObjectMissing):
        store.get_manifest(manifest.digest)  # the manifest is published last, so never over a bad blob


def test_a_store_that_stops_answering_is_an_error_within_its_timeouts_not_a_hang(s3_endpoint: str) -> None:
    # The defect: the artifact store's client had boto3's defaults (60 s for each answer, retried), so a
    # store that took requests in and never answered held a push or a worker's fetch for minutes, silently.
    from revgate.registry import store_s3
    from revgate.registry.errors import StoreError
    from tests.integration.s3_proxy import slow_to_answer

    assert store_s3.S3Backend("any").client.meta.config.read_timeout == store_s3.READ_TIMEOUT_S  # explicit
    bucket = f"artifacts-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    with slow_to_answer(s3_endpoint, lambda method, _: 5.0 if method == "HEAD" else 0.0) as slow:
        backend = store_s3.S3Backend(bucket, endpoint_url=slow, config=store_s3.client_config(read_s=0.5))
        with pytest.raises(StoreError, match=r"(?i)read timeout") as failed:
            backend.exists("blobs/sha256/00")
        assert bucket in failed.value.where
