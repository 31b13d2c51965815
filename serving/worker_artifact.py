"""Fetch a pinned artifact into the host cache and verify the exact bytes that will be loaded.

The digest check happens where the load happens: every start re-hashes the cached files (a cache
hit skips only the download), checks the signature against the request's policy and the
revision's compatibility with this host's engine. A cache entry that fails is moved to
``quarantine/`` so the next start fetches it afresh, and nothing is started from it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from manifests.errors import RevgateError
from serving.worker_request import ReplicaRequest


class ArtifactMismatch(RevgateError):
    """The store returned a manifest other than the pinned one."""


@dataclass(frozen=True, slots=True)
class PreparedArtifact:
    """A verified model directory and what fetching and verifying it cost."""

    model_dir: Path
    signature_path: Path
    fetch_s: float
    verify_s: float
    fetched: bool  # False on a cache hit


def cache_paths(cache: Path, manifest_digest: str) -> tuple[Path, Path]:
    """Where a manifest's files and signature live in the host cache."""
    name = manifest_digest.removeprefix("sha256:")
    return cache / "artifacts" / name, cache / "signatures" / f"{name}.sig"


def fetch(request: ReplicaRequest, cache: Path) -> tuple[Path, Path, bool]:
    """Pull the pinned artifact and its signature into the cache unless present; atomic per entry."""
    from registry.store import open_store  # the S3 client loads only when a worker fetches

    digest = request.manifest_digest
    model_dir, signature_path = cache_paths(cache, digest)
    if model_dir.is_dir() and signature_path.is_file():
        return model_dir, signature_path, False
    store = open_store(request.store)
    partial = model_dir.with_name(f".{model_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    manifest = store.pull(digest, partial)
    if manifest.digest != digest:
        shutil.rmtree(partial, ignore_errors=True)
        raise ArtifactMismatch(
            f"the store returned manifest {manifest.digest}, not the pinned {digest}",
            where=request.store,
            fix="The store is inconsistent; re-publish the artifact and pin its digest again.",
        )
    signature_path.parent.mkdir(parents=True, exist_ok=True)
    signature_tmp = signature_path.with_name(f".{signature_path.name}.partial-{os.getpid()}")
    signature_tmp.write_bytes(store.get_signature(digest))
    shutil.rmtree(model_dir, ignore_errors=True)
    os.replace(partial, model_dir)
    os.replace(signature_tmp, signature_path)
    return model_dir, signature_path, True


def verify(request: ReplicaRequest, model_dir: Path, signature_path: Path) -> None:
    """Re-hash the files to be loaded, check the signature against the policy and the compatibility."""
    from registry.compat import check_compatibility
    from registry.verify import policy_from_dict, verify_artifact

    policy = policy_from_dict(request.signature_policy)
    verify_artifact(model_dir, request.revision.artifact, signature_path, policy)
    check_compatibility(request.revision, model_dir)


def quarantine(cache: Path, model_dir: Path, signature_path: Path) -> Path:
    """Move a cache entry that failed verification aside, so it is neither loaded nor reused."""
    target = cache / "quarantine" / f"{model_dir.name}-{time.time_ns()}"
    target.mkdir(parents=True)
    with contextlib.suppress(FileNotFoundError):
        os.replace(model_dir, target / "artifact")
    with contextlib.suppress(FileNotFoundError):
        os.replace(signature_path, target / "signature.sig")
    return target


def prepare_artifact(request: ReplicaRequest, cache: Path) -> PreparedArtifact:
    """Fetch (or reuse) and verify the pinned artifact; a failure quarantines the entry and re-raises."""
    started = time.monotonic()
    model_dir, signature_path, fetched = fetch(request, cache)
    fetched_at = time.monotonic()
    try:
        verify(request, model_dir, signature_path)
    except RevgateError as error:
        where = quarantine(cache, model_dir, signature_path)
        # Same typed error, its explanation extended by where the evidence went.
        error.args = (f"{error} The cache entry was moved to {where}; the next start fetches it again.",)
        raise
    return PreparedArtifact(model_dir, signature_path, fetched_at - started, time.monotonic() - fetched_at, fetched)
