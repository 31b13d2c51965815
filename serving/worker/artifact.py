"""Fetch a pinned artifact into the host cache and verify the exact bytes that will be loaded.

The digest check happens where the load happens: every start re-hashes the cached files (a cache
hit skips only the download), checks the signature against the request's policy, the revision's
runtime against this host's engine, and the artifact's compatibility with the execution config.
A cache entry that fails is moved to ``quarantine/`` so the next start fetches it afresh, and
nothing is started from it; replicas already loading or serving it keep their own links.

A start for a replica names a folder of its own (``into``): the verified files are hard-linked
there and the folder is what is verified and loaded (see :mod:`serving.worker.sealed`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from manifests.errors import RevgateError
from registry.compat import CPU_ENGINE, EngineCapabilities, check_compatibility
from registry.errors import VerificationError
from registry.runtime import engine_runtime
from registry.signing import CertificatePolicy, IdentityPolicy, KeyPolicy, Policy
from registry.store import open_store
from registry.tree import served_path
from registry.verify import verify_artifact
from serving.worker.engine import Device
from serving.worker.request import ReplicaRequest, SignaturePolicySpec
from serving.worker.sealed import FileStamp, link_tree, remove_tree, seal, stamps, unseal_folders

# GPU vLLM's attention kernels take any head size that is a multiple of 8 up to 256, and more
# quantization kernels than the CPU build.
GPU_ENGINE = EngineCapabilities(
    head_sizes=frozenset(range(32, 257, 8)),
    quantization=frozenset({"awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors", "fp8", "bitsandbytes"}),
)


class ArtifactRefused(RevgateError):
    """The worker will not load this artifact (no signature published, wrong runtime, store mismatch)."""


@dataclass(frozen=True, slots=True)
class PreparedArtifact:
    """A verified, read-only model directory, its files' stamps, and what fetching and verifying cost."""

    model_dir: Path  # the replica's own folder when one was named, else the cache entry
    signature_path: Path
    fetch_s: float
    verify_s: float
    fetched: bool  # False on a cache hit
    stamps: dict[str, FileStamp]
    served: Path  # what the engine loads: ``model_dir``, or its one file for a single-file artifact


def trust_policy(spec: SignaturePolicySpec) -> Policy:
    """The registry's verification policy for a policy spec."""
    if spec.kind == "key" and spec.public_key is not None:
        return KeyPolicy(Path(spec.public_key))
    if spec.kind == "certificate":
        return CertificatePolicy(tuple(Path(path) for path in spec.chain))
    return IdentityPolicy(identity=spec.identity or "", issuer=spec.issuer or "")


def cache_paths(cache: Path, manifest_digest: str) -> tuple[Path, Path]:
    """Where a manifest's files and signature live in the host cache."""
    name = manifest_digest.removeprefix("sha256:")
    return cache / "artifacts" / name, cache / "signatures" / f"{name}.sig"


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    partial.write_bytes(data)
    os.replace(partial, path)


def fetch(request: ReplicaRequest, cache: Path) -> tuple[Path, Path, bool]:
    """Pull the pinned artifact and its signature into the cache unless present; each lands whole or not at all."""
    digest = request.manifest_digest
    model_dir, signature_path = cache_paths(cache, digest)
    if model_dir.is_dir() and signature_path.is_file():
        return model_dir, signature_path, False
    store = open_store(request.store)
    signature = store.get_signature(digest)
    if signature is None:
        raise ArtifactRefused("no signature is published for the pinned artifact", where=request.store,
                              fix="Sign the artifact and push the signature; unsigned artifacts are never loaded.")
    if not model_dir.is_dir():
        manifest = store.pull(digest, model_dir)  # the store stages and renames: never a partial folder
        if manifest.digest != digest:
            raise ArtifactRefused(f"the store returned manifest {manifest.digest}, not the pinned {digest}",
                                  where=request.store, fix="The store is inconsistent; re-publish the artifact.")
    _write_atomically(signature_path, signature)
    return model_dir, signature_path, True


def check_runtime(request: ReplicaRequest, engine_venv: Path) -> None:
    """Refuse a revision pinned to another engine build than this host's (the runtime ``e`` is identity)."""
    host = engine_runtime(engine_venv)
    if host.digest != request.revision.runtime.digest:
        pinned = request.revision.runtime
        raise ArtifactRefused(
            f"the revision pins runtime {pinned.engine_distribution} {pinned.engine_version} "
            f"(lock {pinned.lock_digest[:19]}), this worker runs {host.engine_distribution} {host.engine_version} "
            f"(lock {host.lock_digest[:19]})",
            where=str(engine_venv),
            fix="Start the revision on a worker with its engine build, or make a revision for this runtime.",
        )


def verify(request: ReplicaRequest, model_dir: Path, signature_path: Path, engine: EngineCapabilities) -> None:
    """Re-hash the files to be loaded, check the signature against the policy, and the compatibility.

    A single-file artifact (a GGUF file) carries its model config inside the file, where the engine
    reads it; the config.json checks apply to folders only.
    """
    revision = request.revision
    verify_artifact(model_dir, revision.artifact, signature_path, trust_policy(request.signature_policy))
    if served_path(model_dir, revision.artifact) != model_dir:
        return
    check_compatibility(model_dir, revision.artifact, revision.execution, revision.interface, revision.adapter,
                        engine=engine)


def quarantine(cache: Path, model_dir: Path, signature_path: Path) -> Path:
    """Move a cache entry that failed verification aside, so it is neither loaded nor reused."""
    target = cache / "quarantine" / f"{model_dir.name}-{time.time_ns()}"
    target.mkdir(parents=True)
    with contextlib.suppress(FileNotFoundError):
        unseal_folders(model_dir)  # a folder is moved to another parent only when writable
    with contextlib.suppress(FileNotFoundError):
        os.replace(model_dir, target / "artifact")
    with contextlib.suppress(FileNotFoundError):
        os.replace(signature_path, target / "signature.sig")
    return target


class ArtifactPreparer:
    """Fetch and verify for one host: its engine environment and device decide runtime and capabilities.

    Starts of the same artifact are serialised (one lock per manifest digest), so two replicas
    starting at once share one download and never see each other's half-placed or quarantined entry.
    """

    def __init__(self, engine_venv: Path, device: Device = "cpu") -> None:
        self.engine_venv = engine_venv
        self.device = device
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock(self, digest: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(digest, threading.Lock())

    def __call__(self, request: ReplicaRequest, cache: Path, into: Path | None = None) -> PreparedArtifact:
        """Fetch (or reuse), seal, link ``into`` a replica's folder when given, and verify what will be loaded.

        Failed bytes quarantine the cache entry; any failure removes ``into`` and re-raises.
        """
        request.warm.check_fits(request.revision.execution.max_model_len, where="ReplicaRequest.warm")
        check_runtime(request, self.engine_venv)
        with self._lock(request.manifest_digest):
            started = time.monotonic()
            model_dir, signature_path, fetched = fetch(request, cache)
            fetched_at = time.monotonic()
            try:
                seal(model_dir)
                loaded = model_dir if into is None else link_tree(model_dir, into)
                verify(request, loaded, signature_path, CPU_ENGINE if self.device == "cpu" else GPU_ENGINE)
                verified = stamps(loaded)
            except BaseException as error:
                if into is not None:
                    remove_tree(into)
                # Unproven bytes are quarantined; an incompatibility is not the cache's fault.
                if isinstance(error, VerificationError):
                    where = quarantine(cache, model_dir, signature_path)
                    # The same typed error, its explanation extended by where the evidence went.
                    error.args = (f"{error} The cache entry was moved to {where}; the next start fetches it again.",)
                raise
        return PreparedArtifact(loaded, signature_path, fetched_at - started, time.monotonic() - fetched_at,
                                fetched, verified, served_path(loaded, request.revision.artifact))
