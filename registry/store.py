"""Write-once, content-addressed artifact stores: a local folder (the default) and S3.

Layout under the store root (a folder, or an S3 bucket and prefix)::

    blobs/sha256/<hex>       file bytes, addressed by their sha256
    signatures/<hex>.sig     the signature of the artifact manifest with digest sha256:<hex>
    manifests/<hex>.json     the canonical artifact manifest with digest sha256:<hex>

Nothing correct is ever overwritten: the local store links a finished, fsynced temporary file into
place (a link fails if the name exists) and fsyncs the folder, S3 writes carry ``If-None-Match: *``.
A push re-hashes every object that already exists: a corrupt one is replaced (conditionally, on the
version that was hashed) or refused with ObjectCorrupt, so a bad copy is never permanent. A push
writes blobs first and the manifest last, so a manifest that can be read implies its blobs are there.
A pull streams every blob into a temporary folder, hashing as it goes, and renames the folder into
place only when every file matched and was fsynced: a partial or corrupt download never appears
under its final name.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Protocol
from urllib.parse import urlparse

from revgate.manifests.artifact import ArtifactManifest
from revgate.manifests.canonical import DIGEST, sha256_digest
from revgate.registry.durable import Writer, fsync_folder, link_once, write_temporary
from revgate.registry.errors import DigestMismatch, ObjectCorrupt, ObjectExists, ObjectMissing, StoreError
from revgate.registry.hashing import BUFFER_BYTES, Progress
from revgate.registry.tree import artifact_root
from revgate.registry.verify import check_tree


class Backend(Protocol):
    """Write-once object storage: ``put_*`` returns False (and writes nothing) if the key exists."""

    def describe(self) -> str:
        """Where the store lives, for messages."""

    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    def put_bytes(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` unless the key exists."""

    def put_file(self, key: str, path: Path, progress: Progress | None) -> bool:
        """Store the file's bytes under ``key`` unless the key exists."""

    def get_bytes(self, key: str) -> bytes:
        """The object's bytes; ObjectMissing if absent."""

    def stream(self, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks; ObjectMissing if absent."""

    def version(self, key: str) -> str | None:
        """A tag that changes whenever the object does (None if absent)."""

    def replace_file(self, key: str, path: Path, version: str) -> bool:
        """Overwrite a corrupt object with the file's bytes if it is still at ``version``; False otherwise."""


def _hex(digest: str) -> str:
    if not DIGEST.match(digest):
        raise StoreError("not a manifest digest", where=digest, fix="Pass sha256:<64 lowercase hex>.")
    return digest.removeprefix("sha256:")


def blob_key(sha256_hex: str) -> str:
    """Key of a file's bytes."""
    return f"blobs/sha256/{sha256_hex}"


def manifest_key(digest: str) -> str:
    """Key of a canonical artifact manifest."""
    return f"manifests/{_hex(digest)}.json"


def signature_key(digest: str) -> str:
    """Key of the signature of the manifest with this digest."""
    return f"signatures/{_hex(digest)}.sig"


# ---------------------------------------------------------------------------------------------
# Local folder


def _copy(path: Path, stream: BinaryIO, progress: Progress | None) -> None:
    with path.open("rb") as source:
        while chunk := source.read(BUFFER_BYTES):
            stream.write(chunk)
            if progress is not None:
                progress(len(chunk))


class LocalBackend:
    """A folder; objects are read-only files linked into place when complete."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self) -> str:
        """The folder."""
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def exists(self, key: str) -> bool:
        """Whether the file exists."""
        return self._path(key).is_file()

    def _publish(self, key: str, write: Writer) -> bool:
        final = self._path(key)
        if final.exists():
            return False
        temp_dir = self.root / ".tmp"
        temp_dir.mkdir(parents=True, exist_ok=True)
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = write_temporary(temp_dir, write, mode=0o444)
        try:
            return link_once(temp, final)
        finally:
            os.unlink(temp)

    def version(self, key: str) -> str | None:
        """Inode, size and modification time."""
        try:
            info = self._path(key).stat()
        except FileNotFoundError:
            return None
        return f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"

    def replace_file(self, key: str, path: Path, version: str) -> bool:
        """Rename a fresh, fsynced copy over the corrupt file (the folder's permissions allow it, not the file's)."""
        final = self._path(key)
        temp = write_temporary(final.parent, lambda stream: _copy(path, stream, None), mode=0o444)
        try:
            if self.version(key) != version:
                return False
            os.replace(temp, final)
        finally:
            temp.unlink(missing_ok=True)
        fsync_folder(final.parent)
        return True

    def put_bytes(self, key: str, data: bytes) -> bool:
        """Write once."""
        return self._publish(key, lambda stream: stream.write(data))

    def put_file(self, key: str, path: Path, progress: Progress | None) -> bool:
        """Copy once."""
        return self._publish(key, lambda stream: _copy(path, stream, progress))

    def get_bytes(self, key: str) -> bytes:
        """Read the whole object."""
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectMissing("object not in store", where=f"{self.root}/{key}",
                                fix="Push the artifact first, or check the digest and store URL.") from None

    def stream(self, key: str) -> Iterator[bytes]:
        """Read in chunks."""
        try:
            source = self._path(key).open("rb")
        except FileNotFoundError:
            raise ObjectMissing("object not in store", where=f"{self.root}/{key}",
                                fix="Push the artifact first, or check the digest and store URL.") from None
        with source:
            while chunk := source.read(BUFFER_BYTES):
                yield chunk


# ---------------------------------------------------------------------------------------------
# The content-addressed store


class ArtifactStore:
    """Push and pull pinned artifacts; every object is write-once and checked against its digest."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def push(self, model_dir: Path, manifest: ArtifactManifest, signature: Path | None = None, *,
             progress: Progress | None = None) -> str:
        """Publish the artifact (checked to equal ``manifest``) and its signature; returns the manifest digest.

        ``model_dir`` is the artifact's folder, or its one file for a single-file artifact.
        """
        root = artifact_root(model_dir)
        check_tree(model_dir, {entry.path: entry.sha256 for entry in manifest.entries})
        for entry in manifest.entries:
            key = blob_key(entry.sha256)
            if self.backend.exists(key) or not self.backend.put_file(key, root / entry.path, progress):
                self._keep_or_repair(key, entry.sha256, entry.size, root / entry.path)
                if progress is not None:
                    progress(entry.size)
        if signature is not None:
            self._put_signature(manifest.digest, signature.read_bytes())
        self._put_manifest(manifest)
        return manifest.digest

    def _stored_digest(self, key: str) -> tuple[str, int]:
        digest = hashlib.sha256()
        size = 0
        for chunk in self.backend.stream(key):
            digest.update(chunk)
            size += len(chunk)
        return digest.hexdigest(), size

    def _keep_or_repair(self, key: str, sha256_hex: str, size: int, source: Path) -> None:
        """Re-hash an object that already exists; replace it if corrupt, else ObjectCorrupt."""
        version = self.backend.version(key)
        if version is None or self._stored_digest(key) == (sha256_hex, size):
            return
        repaired = self.backend.replace_file(key, source, version)
        if not repaired or self._stored_digest(key) != (sha256_hex, size):
            raise ObjectCorrupt(
                "the stored object does not match its content address and could not be replaced",
                where=f"{self.backend.describe()}/{key}",
                fix="Another writer changed it during the repair, or the store cannot hold the bytes: push again, "
                    "and if it persists check the store's disk or service.",
            )

    def _put_manifest(self, manifest: ArtifactManifest) -> None:
        key = manifest_key(manifest.digest)
        data = manifest.canonical()
        if self.backend.put_bytes(key, data):
            return
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / "manifest.json"
            copy.write_bytes(data)
            self._keep_or_repair(key, sha256_digest(data).removeprefix("sha256:"), len(data), copy)

    def _put_signature(self, digest: str, data: bytes) -> None:
        key = signature_key(digest)
        if not self.backend.put_bytes(key, data) and self.backend.get_bytes(key) != data:
            raise ObjectExists("a different signature is already published for this manifest",
                               where=f"{self.backend.describe()}/{key}",
                               fix="Published objects are never overwritten; keep the existing signature.")

    def get_manifest(self, digest: str) -> ArtifactManifest:
        """The manifest with this digest, checked byte for byte against the digest."""
        key = manifest_key(digest)
        data = self.backend.get_bytes(key)
        actual = sha256_digest(data)
        if actual != digest:
            raise DigestMismatch(key, digest, actual, fix="The store's copy is corrupt; re-push the manifest.")
        return ArtifactManifest.from_canonical(data, source=f"{self.backend.describe()}/{key}")

    def get_small_file(self, manifest: ArtifactManifest, path: str, limit_bytes: int = 1 << 20) -> bytes:
        """One small file of the artifact (its config.json), checked against its manifest entry, without the rest."""
        entry = next((entry for entry in manifest.entries if entry.path == path), None)
        where = f"{self.backend.describe()} (artifact {manifest.digest}, {path})"
        if entry is None:
            raise StoreError(f"the artifact has no file {path!r}", where=where,
                             fix="Publish an artifact whose manifest lists it.")
        if entry.size > limit_bytes:
            raise StoreError(f"{path} is {entry.size} bytes, more than the {limit_bytes} a controller reads",
                             where=where, fix="Keep config files small; weights never come to the controller.")
        data = self.backend.get_bytes(blob_key(entry.sha256))
        actual = sha256_digest(data)
        if actual.removeprefix("sha256:") != entry.sha256.removeprefix("sha256:") or len(data) != entry.size:
            raise DigestMismatch(blob_key(entry.sha256), entry.sha256, actual,
                                 fix="The store's copy is corrupt; re-push the artifact.")
        return data

    def get_signature(self, digest: str) -> bytes | None:
        """The published signature of the manifest, or None."""
        key = signature_key(digest)
        return self.backend.get_bytes(key) if self.backend.exists(key) else None

    def pull(self, digest: str, dest: Path, *, progress: Progress | None = None) -> ArtifactManifest:
        """Download the artifact into ``dest`` (which must not exist), verifying every byte on the way."""
        manifest = self.get_manifest(digest)
        if dest.exists() or dest.is_symlink():
            raise StoreError("destination already exists", where=str(dest),
                             fix="Pull into a new folder; a pulled artifact is never merged into another.")
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = dest.parent / f".{dest.name}.partial-{secrets.token_hex(4)}"
        staging.mkdir()
        try:
            for entry in manifest.entries:
                self._download(entry.sha256, entry.size, staging / entry.path, entry.path, progress)
            for folder in _folders_deepest_first(staging, manifest):
                fsync_folder(folder)  # every name under staging is durable before the rename
            os.rename(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        fsync_folder(dest.parent)
        return manifest

    def _download(self, sha256_hex: str, size: int, target: Path, where: str, progress: Progress | None) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        received = 0
        with target.open("xb") as stream:
            for chunk in self.backend.stream(blob_key(sha256_hex)):
                digest.update(chunk)
                stream.write(chunk)
                received += len(chunk)
                if progress is not None:
                    progress(len(chunk))
            stream.flush()
            os.fsync(stream.fileno())
        if digest.hexdigest() != sha256_hex or received != size:
            raise DigestMismatch(where, sha256_hex, digest.hexdigest(),
                                 fix="The store's copy is corrupt or truncated; nothing was placed. Re-push it.")


def _folders_deepest_first(root: Path, manifest: ArtifactManifest) -> list[Path]:
    folders = {root / parent for entry in manifest.entries for parent in PurePosixPath(entry.path).parents}
    return sorted(folders, key=lambda folder: len(folder.parts), reverse=True)


_S3_URL = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?$")


def open_store(url: str, *, endpoint_url: str | None = None, **s3_options: Any) -> ArtifactStore:
    """The store at ``url``: ``s3://bucket/prefix``, ``file:///path``, or a plain folder path."""
    if url.startswith("s3://"):
        match = _S3_URL.match(url)
        if not match:
            raise StoreError("malformed S3 URL", where=url, fix="Use s3://bucket/prefix.")
        from revgate.registry.store_s3 import S3Backend  # deferred: only S3 users pay for importing boto3

        return ArtifactStore(S3Backend(match["bucket"], match["prefix"] or "", endpoint_url=endpoint_url,
                                       **s3_options))
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return ArtifactStore(LocalBackend(Path(parsed.path)))
    if parsed.scheme and len(parsed.scheme) > 1:
        raise StoreError(f"unsupported store scheme {parsed.scheme!r}", where=url,
                         fix="Use a folder path, file:///path or s3://bucket/prefix.")
    return ArtifactStore(LocalBackend(Path(url)))
