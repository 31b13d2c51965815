"""The worker's side of the verification pipeline: per-host engine, per-digest lock, sealed replica folders.

Fetching, re-hashing, the signature, the runtime and compatibility checks and the quarantine of
unproven bytes are :func:`registry.pipeline.prepare_artifact`, the same entry point the promotion
flow calls. Every start runs it (a cache hit skips only the download). The worker adds what
keeps verified bytes verified while vLLM reads them: the cache entry is sealed read-only, a start
for a replica names a folder of its own (``into``) where the files are hard-linked, and that
folder is what is verified, stamped and loaded (see :mod:`serving.worker.sealed`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from revgate.registry.compat import CPU_ENGINE, GPU_ENGINE
from revgate.registry.pipeline import PreparedArtifact, prepare_artifact
from revgate.registry.runtime import engine_runtime
from revgate.registry.signing import CertificatePolicy, IdentityPolicy, KeyPolicy, Policy
from revgate.serving.worker.engine import Device
from revgate.serving.worker.request import ReplicaRequest, SignaturePolicySpec
from revgate.serving.worker.sealed import FileStamp, link_tree, remove_tree, seal, stamps


@dataclass(frozen=True, slots=True)
class SealedArtifact(PreparedArtifact):
    """A verified artifact whose files are read-only, with each file's stamp taken right after verification.

    ``model_dir`` is the replica's own folder when one was named, else the cache entry.
    """

    stamps: dict[str, FileStamp]


def trust_policy(spec: SignaturePolicySpec) -> Policy:
    """The registry's verification policy for a policy spec."""
    if spec.kind == "key" and spec.public_key is not None:
        return KeyPolicy(Path(spec.public_key))
    if spec.kind == "certificate":
        return CertificatePolicy(tuple(Path(path) for path in spec.chain))
    return IdentityPolicy(identity=spec.identity or "", issuer=spec.issuer or "")


def sealed_into(into: Path | None) -> Callable[[Path], Path]:
    """The pipeline's ``place`` hook: seal the cache entry, then link it into ``into`` when given."""

    def place(entry: Path) -> Path:
        seal(entry)
        return entry if into is None else link_tree(entry, into)

    return place


class ArtifactPreparer:
    """Fetch and verify for one host: its engine environment and device decide runtime and capabilities.

    Starts of the same artifact are serialised (one lock per manifest digest), so two replicas
    starting at once share one download and never see each other's half-placed or quarantined entry.
    """

    def __init__(self, engine_venv: Path, device: Device = "cpu") -> None:
        self.engine_venv = engine_venv
        self.engine = CPU_ENGINE if device == "cpu" else GPU_ENGINE
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock(self, digest: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(digest, threading.Lock())

    def __call__(self, request: ReplicaRequest, cache: Path, into: Path | None = None) -> SealedArtifact:
        """Fetch (or reuse), seal, link ``into`` a replica's folder when given, and verify what will be loaded.

        Failed bytes quarantine the cache entry (the pipeline does); any failure removes ``into`` and re-raises.
        """
        request.warm.check_fits(request.revision.execution.max_model_len, where="ReplicaRequest.warm")
        host_runtime = engine_runtime(self.engine_venv)
        with self._lock(request.manifest_digest):
            try:
                prepared = prepare_artifact(request.revision, store=request.store, cache=cache,
                                            policy=trust_policy(request.signature_policy), host_runtime=host_runtime,
                                            engine=self.engine, place=sealed_into(into))
                verified = stamps(prepared.model_dir)
            except BaseException:
                if into is not None:
                    remove_tree(into)
                raise
        return SealedArtifact(**{field.name: getattr(prepared, field.name) for field in fields(prepared)},
                              stamps=verified)
