"""The verification pipeline, one entry point for every caller: fetch, hash, signature, runtime, compatibility.

The worker calls it where the load happens, the promotion flow calls it before anything is
loaded; both get the same checks in the same order and the same typed errors:

1. runtime: the revision's pinned engine build must be this host's (ArtifactRefused), checked
   before a byte is fetched;
2. fetch: the pinned manifest and its published signature into the host cache, each placed whole
   or not at all (ArtifactRefused when no signature is published);
3. hash and signature: every byte to be loaded re-hashed against the pinned manifest, the signature
   checked against the trust policy (a VerificationError quarantines the cache entry, so the next
   start fetches afresh);
4. compatibility of the artifact with the execution config and interface (IncompatibleArtifact;
   the cache entry is kept: the bytes are fine, the plan is not).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from revgate.manifests.revision import RuntimeEnvironment, ServiceRevision
from revgate.registry.compat import CPU_ENGINE, EngineCapabilities, check_compatibility
from revgate.registry.durable import replace_file
from revgate.registry.errors import ArtifactRefused, VerificationError
from revgate.registry.signing import Policy
from revgate.registry.store import open_store
from revgate.registry.tree import served_path
from revgate.registry.verify import VerifiedArtifact, verify_artifact


@dataclass(frozen=True, slots=True)
class PreparedArtifact:
    """A verified artifact ready to load, and what fetching and verifying it cost."""

    model_dir: Path  # the verified folder
    served: Path  # what the engine loads: ``model_dir``, or its one file for a single-file artifact
    signature_path: Path
    signer: str
    fetch_s: float
    verify_s: float
    fetched: bool  # False on a cache hit


def cache_paths(cache: Path, manifest_digest: str) -> tuple[Path, Path]:
    """Where a manifest's files and signature live in the host cache."""
    name = manifest_digest.removeprefix("sha256:")
    return cache / "artifacts" / name, cache / "signatures" / f"{name}.sig"


def fetch(store_url: str, digest: str, cache: Path) -> tuple[Path, Path, bool]:
    """Pull the pinned artifact and its signature into the cache unless present; each lands whole or not at all."""
    model_dir, signature_path = cache_paths(cache, digest)
    if model_dir.is_dir() and signature_path.is_file():
        return model_dir, signature_path, False
    store = open_store(store_url)
    signature = store.get_signature(digest)
    if signature is None:
        raise ArtifactRefused("no signature is published for the pinned artifact", where=store_url,
                              fix="Sign the artifact and push the signature; unsigned artifacts are never loaded.")
    if not model_dir.is_dir():
        manifest = store.pull(digest, model_dir)  # the store stages and renames: never a partial folder
        if manifest.digest != digest:
            raise ArtifactRefused(f"the store returned manifest {manifest.digest}, not the pinned {digest}",
                                  where=store_url, fix="The store is inconsistent; re-publish the artifact.")
    signature_path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(signature_path, signature)
    return model_dir, signature_path, True


def check_runtime(pinned: RuntimeEnvironment, host: RuntimeEnvironment, *, where: str) -> None:
    """Refuse a revision pinned to another engine build than this host's (the runtime ``e`` is identity)."""
    if host.digest != pinned.digest:
        raise ArtifactRefused(
            f"the revision pins runtime {pinned.engine_distribution} {pinned.engine_version} "
            f"(lock {pinned.lock_digest[:19]}), this host runs {host.engine_distribution} {host.engine_version} "
            f"(lock {host.lock_digest[:19]})",
            where=where,
            fix="Start the revision on a host with its engine build, or make a revision for this runtime.",
        )


def verify_revision(revision: ServiceRevision, model_dir: Path, signature: Path, policy: Policy, *,
                    engine: EngineCapabilities = CPU_ENGINE) -> VerifiedArtifact:
    """Hash, signature and compatibility of a local artifact folder for ``revision``.

    A single-file artifact (a GGUF file) carries its model config inside the file, where the
    engine reads it; the config.json checks apply to folders only.
    """
    verified = verify_artifact(model_dir, revision.artifact, signature, policy)
    if served_path(model_dir, revision.artifact) == model_dir:
        check_compatibility(model_dir, revision.artifact, revision.execution, revision.interface, revision.adapter,
                            engine=engine)
    return verified


def quarantine(cache: Path, model_dir: Path, signature_path: Path) -> Path:
    """Move a cache entry that failed verification aside, so it is neither loaded nor reused."""
    target = cache / "quarantine" / f"{model_dir.name}-{time.time_ns()}"
    target.mkdir(parents=True)
    with contextlib.suppress(FileNotFoundError):
        _writable_folders(model_dir)  # a folder moves to another parent only when writable
        os.replace(model_dir, target / "artifact")
    with contextlib.suppress(FileNotFoundError):
        os.replace(signature_path, target / "signature.sig")
    return target


def _writable_folders(root: Path) -> None:
    for folder, _, _ in os.walk(root):
        os.chmod(folder, os.stat(folder).st_mode | stat.S_IWUSR)


def prepare_artifact(
    revision: ServiceRevision,
    *,
    store: str,
    cache: Path,
    policy: Policy,
    host_runtime: RuntimeEnvironment,
    engine: EngineCapabilities = CPU_ENGINE,
    place: Callable[[Path], Path] | None = None,
) -> PreparedArtifact:
    """Fetch (or reuse) the revision's pinned artifact and verify exactly what will be loaded.

    ``place`` turns the cache entry into the folder to load (a caller that seals the cache or links
    it into a per-replica folder passes it); the checks run on what it returns. Unproven bytes are
    quarantined and the typed error re-raised; nothing is returned from a failed check.
    """
    digest = revision.artifact.digest
    check_runtime(revision.runtime, host_runtime, where=f"{store} {digest}")
    started = time.monotonic()
    model_dir, signature_path, fetched = fetch(store, digest, cache)
    fetched_at = time.monotonic()
    try:
        loaded = place(model_dir) if place is not None else model_dir
        verified = verify_revision(revision, loaded, signature_path, policy, engine=engine)
    except VerificationError as error:
        where = quarantine(cache, model_dir, signature_path)
        # The same typed error, its explanation extended by where the evidence went.
        error.args = (f"{error} The cache entry was moved to {where}; the next start fetches it again.",)
        raise
    return PreparedArtifact(loaded, served_path(loaded, revision.artifact), signature_path, verified.signer,
                            fetched_at - started, time.monotonic() - fetched_at, fetched)
