"""Verify an artifact folder before a byte of it is loaded: signature, signer, file set, digests.

Order matters for cost, not for safety: the signature and the signer are checked first (cheap),
then the signed file list against the pinned manifest, then the folder's file set, then every
file is re-hashed in parallel from the exact bytes on disk. Any failure raises a typed
VerificationError and returns nothing, so nothing can be loaded from a failed check.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from revgate.manifests.artifact import ArtifactManifest
from revgate.registry.errors import DigestMismatch, ManifestMismatch, MissingFile, UnexpectedFile
from revgate.registry.hashing import Progress, hash_tree
from revgate.registry.signing import SINGLE_FILE, Policy, read_signed_files
from revgate.registry.tree import artifact_root, list_files


@dataclass(frozen=True)
class VerifiedArtifact:
    """An artifact folder whose bytes equal the pinned, signed manifest at the time of the check."""

    model_dir: Path
    manifest: ArtifactManifest
    signer: str

    @property
    def digest(self) -> str:
        """The pinned artifact manifest digest."""
        return self.manifest.digest


def signature_disagreement(signed: Mapping[str, str], manifest: ArtifactManifest) -> str | None:
    """Why the signed files differ from the manifest, entry for entry, or None when they agree."""
    pinned = {entry.path: entry.sha256 for entry in manifest.entries}
    problems = [f"only signed: {path}" for path in sorted(signed.keys() - pinned.keys())]
    problems += [f"only in manifest: {path}" for path in sorted(pinned.keys() - signed.keys())]
    problems += [f"digest differs: {path}" for path in sorted(signed.keys() & pinned.keys())
                 if signed[path] != pinned[path]]
    return "; ".join(problems) or None


def as_artifact_paths(signed: Mapping[str, str], names: Collection[str], signature: Path) -> Mapping[str, str]:
    """The signed files by artifact path: a single-file signature ("." in model_signing) names the one file."""
    if set(signed) != {SINGLE_FILE}:
        return signed
    if len(names) != 1:
        raise ManifestMismatch(f"the signature covers a single file, the artifact has {len(names)} files",
                               where=str(signature), fix="Use the signature made for this artifact.")
    return {next(iter(names)): signed[SINGLE_FILE]}


def check_file_set(on_disk: tuple[str, ...], expected: Mapping[str, str]) -> None:
    """Refuse a folder whose files are not exactly the expected ones (missing first, then extra)."""
    missing = sorted(expected.keys() - set(on_disk))
    extra = sorted(set(on_disk) - expected.keys())
    if missing:
        also = f" (and unexpected {', '.join(extra)}: renamed?)" if extra else ""
        raise MissingFile(f"pinned file is missing{also}", where=", ".join(missing),
                          fix="Fetch the artifact again; do not rename or delete files of a pinned artifact.")
    if extra:
        raise UnexpectedFile("file is not part of the pinned artifact", where=", ".join(extra),
                             fix="Remove it, or build, sign and pin a new artifact that includes it.")


def check_tree(
    model_dir: Path, expected: Mapping[str, str], *, workers: int | None = None, progress: Progress | None = None
) -> None:
    """Check that ``model_dir`` holds exactly ``expected`` (path -> sha256 hex), re-hashing every byte."""
    on_disk = list_files(model_dir)
    check_file_set(on_disk, expected)
    digests = hash_tree(artifact_root(model_dir), on_disk, workers=workers, progress=progress)
    for path in on_disk:
        if digests[path].sha256 != expected[path]:
            raise DigestMismatch(path, expected[path], digests[path].sha256)


def check_signature_matches(signed: Mapping[str, str], manifest: ArtifactManifest, signature: Path) -> None:
    """Refuse a signature whose files and digests differ from the pinned manifest."""
    problem = signature_disagreement(signed, manifest)
    if problem:
        raise ManifestMismatch(f"signature and pinned manifest disagree: {problem}", where=str(signature),
                               fix="Use the signature made for this manifest, or re-sign the pinned artifact.")


def verify_artifact(
    model_dir: Path,
    manifest: ArtifactManifest,
    signature: Path,
    policy: Policy,
    *,
    workers: int | None = None,
    progress: Progress | None = None,
) -> VerifiedArtifact:
    """Prove that ``model_dir`` is exactly the pinned ``manifest``, signed by a signer ``policy`` trusts.

    ``model_dir`` is the artifact's folder, or its one file for a single-file artifact (a GGUF file,
    say); a single-file signature (model_signing's ".") names that file. Re-hashes the exact bytes
    on disk; refuses symlinks, extra and missing files. Raises a
    subclass of VerificationError naming the file or field and what to do.
    """
    signed = read_signed_files(signature, policy)
    files = as_artifact_paths(signed.files, [entry.path for entry in manifest.entries], signature)
    check_signature_matches(files, manifest, signature)
    check_tree(model_dir, {entry.path: entry.sha256 for entry in manifest.entries}, workers=workers,
               progress=progress)
    return VerifiedArtifact(model_dir=model_dir, manifest=manifest, signer=signed.signer)


def verify_signed_folder(
    model_dir: Path, signature: Path, policy: Policy, *, workers: int | None = None, progress: Progress | None = None
) -> str:
    """Check ``model_dir`` against the signature alone (no pinned manifest); returns the signer."""
    signed = read_signed_files(signature, policy)
    files = as_artifact_paths(signed.files, list_files(model_dir), signature)
    check_tree(model_dir, files, workers=workers, progress=progress)
    return signed.signer
