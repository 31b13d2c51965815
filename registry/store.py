"""Write-once, content-addressed artifact stores: a local folder (the default) and S3.

Layout under the store root (a folder, or an S3 bucket and prefix)::

    blobs/sha256/<hex>       file bytes, addressed by their sha256
    signatures/<hex>.sig     the signature of the artifact manifest with digest sha256:<hex>
    manifests/<hex>.json     the canonical artifact manifest with digest sha256:<hex>

Nothing is ever overwritten: the local store links a finished temporary file into place (a link
fails if the name exists), S3 writes carry ``If-None-Match: *``. A push writes blobs first and the
manifest last, so a manifest that can be read implies its blobs are there. A pull streams every
blob into a temporary folder, hashing as it goes, and renames the folder into place only when
every file matched: a partial or corrupt download never appears under its final name.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from manifests.artifact import ArtifactManifest
from manifests.canonical import DIGEST, sha256_digest
from registry.errors import DigestMismatch, ObjectExists, ObjectMissing, StoreError
from registry.hashing import BUFFER_BYTES, Progress
from registry.verify import check_tree

MULTIPART_THRESHOLD = 64 * 1024 * 1024
PART_BYTES = 16 * 1024 * 1024


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

    def _publish(self, key: str, write: Any) -> bool:
        final = self._path(key)
        if final.exists():
            return False
        temp_dir = self.root / ".tmp"
        temp_dir.mkdir(parents=True, exist_ok=True)
        final.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=temp_dir)
        try:
            with os.fdopen(handle, "wb") as stream:
                write(stream)
            os.chmod(temp, 0o444)
            os.link(temp, final)  # atomic and refuses an existing name: write-once
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)

    def put_bytes(self, key: str, data: bytes) -> bool:
        """Write once."""
        return self._publish(key, lambda stream: stream.write(data))

    def put_file(self, key: str, path: Path, progress: Progress | None) -> bool:
        """Copy once."""

        def copy(stream: Any) -> None:
            with path.open("rb") as source:
                while chunk := source.read(BUFFER_BYTES):
                    stream.write(chunk)
                    if progress is not None:
                        progress(len(chunk))

        return self._publish(key, copy)

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
# S3


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _precondition_failed(error: ClientError) -> bool:
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return _code(error) in {"PreconditionFailed", "ConditionalRequestConflict"} or status in {409, 412}


class S3Backend:
    """An S3 bucket and prefix; writes are conditional (If-None-Match: *), large files go multipart."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client: Any = None,
                 multipart_threshold: int = MULTIPART_THRESHOLD, part_bytes: int = PART_BYTES) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self.client = client or boto3.client("s3", endpoint_url=endpoint,
                                             config=BotoConfig(retries={"max_attempts": 3, "mode": "standard"}))
        self.multipart_threshold = multipart_threshold
        self.part_bytes = part_bytes

    def describe(self) -> str:
        """The S3 URL."""
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _failure(self, error: Exception, key: str) -> StoreError:
        if isinstance(error, ClientError) and _code(error) in {"NoSuchKey", "404", "NotFound"}:
            return ObjectMissing("object not in store", where=f"{self.describe()}/{key}",
                                 fix="Push the artifact first, or check the digest and store URL.")
        return StoreError(f"S3 request failed ({error})", where=f"{self.describe()}/{key}",
                          fix="Check the endpoint (AWS_ENDPOINT_URL), the credentials, and that the bucket exists.")

    def exists(self, key: str) -> bool:
        """HEAD the object."""
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as error:
            if _code(error) in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise self._failure(error, key) from None
        except BotoCoreError as error:
            raise self._failure(error, key) from None

    def _conditional(self, key: str, action: Any) -> bool:
        try:
            action()
            return True
        except ClientError as error:
            if _precondition_failed(error):
                return False
            raise self._failure(error, key) from None
        except BotoCoreError as error:
            raise self._failure(error, key) from None

    def put_bytes(self, key: str, data: bytes) -> bool:
        """Conditional PUT."""
        return self._conditional(key, lambda: self.client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"))

    def put_file(self, key: str, path: Path, progress: Progress | None) -> bool:
        """Conditional PUT, or a multipart upload completed with If-None-Match for large files."""
        size = path.stat().st_size
        if size <= self.multipart_threshold:
            data = path.read_bytes()
            written = self.put_bytes(key, data)
            if progress is not None:
                progress(size)
            return written
        return self._conditional(key, lambda: self._multipart(key, path, progress))

    def _multipart(self, key: str, path: Path, progress: Progress | None) -> None:
        full_key = self._key(key)
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=full_key)["UploadId"]
        try:
            parts: list[dict[str, Any]] = []
            with path.open("rb") as source:
                while chunk := source.read(self.part_bytes):
                    number = len(parts) + 1
                    response = self.client.upload_part(Bucket=self.bucket, Key=full_key, UploadId=upload,
                                                       PartNumber=number, Body=chunk)
                    parts.append({"PartNumber": number, "ETag": response["ETag"]})
                    if progress is not None:
                        progress(len(chunk))
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload,
                                                  MultipartUpload={"Parts": parts}, IfNoneMatch="*")
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload)
            raise

    def get_bytes(self, key: str) -> bytes:
        """GET the whole object."""
        return b"".join(self.stream(key))

    def stream(self, key: str) -> Iterator[bytes]:
        """GET in chunks."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except (ClientError, BotoCoreError) as error:
            raise self._failure(error, key) from None
        try:
            yield from body.iter_chunks(BUFFER_BYTES)
        except BotoCoreError as error:
            raise self._failure(error, key) from None
        finally:
            body.close()


# ---------------------------------------------------------------------------------------------
# The content-addressed store


class ArtifactStore:
    """Push and pull pinned artifacts; every object is write-once and checked against its digest."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def push(self, model_dir: Path, manifest: ArtifactManifest, signature: Path | None = None, *,
             progress: Progress | None = None) -> str:
        """Publish the folder (checked to equal ``manifest``) and its signature; returns the manifest digest."""
        check_tree(model_dir, {entry.path: entry.sha256 for entry in manifest.entries})
        for entry in manifest.entries:
            key = blob_key(entry.sha256)
            if not self.backend.exists(key):
                self.backend.put_file(key, model_dir / entry.path, progress)
            elif progress is not None:
                progress(entry.size)
        if signature is not None:
            self._put_signature(manifest.digest, signature.read_bytes())
        self.backend.put_bytes(manifest_key(manifest.digest), manifest.canonical())
        return manifest.digest

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
        return ArtifactManifest.from_json(data, source=f"{self.backend.describe()}/{key}")

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
            os.rename(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
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
        if digest.hexdigest() != sha256_hex or received != size:
            raise DigestMismatch(where, sha256_hex, digest.hexdigest(),
                                 fix="The store's copy is corrupt or truncated; nothing was placed. Re-push it.")


_S3_URL = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?$")


def open_store(url: str, *, endpoint_url: str | None = None, **s3_options: Any) -> ArtifactStore:
    """The store at ``url``: ``s3://bucket/prefix``, ``file:///path``, or a plain folder path."""
    if url.startswith("s3://"):
        match = _S3_URL.match(url)
        if not match:
            raise StoreError("malformed S3 URL", where=url, fix="Use s3://bucket/prefix.")
        return ArtifactStore(S3Backend(match["bucket"], match["prefix"] or "", endpoint_url=endpoint_url,
                                       **s3_options))
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return ArtifactStore(LocalBackend(Path(parsed.path)))
    if parsed.scheme and len(parsed.scheme) > 1:
        raise StoreError(f"unsupported store scheme {parsed.scheme!r}", where=url,
                         fix="Use a folder path, file:///path or s3://bucket/prefix.")
    return ArtifactStore(LocalBackend(Path(url)))
