"""The S3 backend of the artifact store: conditional writes, multipart uploads for large files.

New objects are written with ``If-None-Match: *``; a corrupt object is replaced only with
``If-Match`` on the ETag that was hashed, so a concurrent repair is never overwritten.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from revgate.registry.errors import ObjectMissing, StoreError
from revgate.registry.hashing import BUFFER_BYTES, Progress

MULTIPART_THRESHOLD = 64 * 1024 * 1024
PART_BYTES = 16 * 1024 * 1024
# boto3's defaults wait 60 s to connect and 60 s for each answer, five times over: a store that stops
# answering held a push or a worker's fetch for ten minutes. A part of PART_BYTES is answered well within
# READ_TIMEOUT_S on any link that can carry a model.
CONNECT_TIMEOUT_S, READ_TIMEOUT_S, ATTEMPTS = 10.0, 60.0, 3


def client_config(connect_s: float = CONNECT_TIMEOUT_S, read_s: float = READ_TIMEOUT_S) -> BotoConfig:
    """The artifact store's botocore settings: explicit timeouts and a few standard retries."""
    return BotoConfig(connect_timeout=connect_s, read_timeout=read_s,
                      retries={"max_attempts": ATTEMPTS, "mode": "standard"})


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _precondition_failed(error: ClientError) -> bool:
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return _code(error) in {"PreconditionFailed", "ConditionalRequestConflict"} or status in {409, 412}


class S3Backend:
    """An S3 bucket and prefix; writes are conditional (If-None-Match: *), large files go multipart."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client: Any = None,
                 multipart_threshold: int = MULTIPART_THRESHOLD, part_bytes: int = PART_BYTES,
                 config: BotoConfig | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self.client = client or boto3.client("s3", endpoint_url=endpoint, config=config or client_config())
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

    def _head(self, key: str) -> dict[str, Any] | None:
        """HEAD the object: its metadata, or None when it is not there."""
        try:
            head: dict[str, Any] = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return head
        except ClientError as error:
            if _code(error) in {"404", "NoSuchKey", "NotFound"}:
                return None
            raise self._failure(error, key) from None
        except BotoCoreError as error:
            raise self._failure(error, key) from None

    def exists(self, key: str) -> bool:
        """HEAD the object."""
        return self._head(key) is not None

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
        return self._put_file(key, path, progress, {"IfNoneMatch": "*"})

    def _put_file(self, key: str, path: Path, progress: Progress | None, condition: dict[str, str]) -> bool:
        size = path.stat().st_size
        if size <= self.multipart_threshold:
            data = path.read_bytes()
            written = self._conditional(key, lambda: self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, **condition))
            if progress is not None:
                progress(size)
            return written
        return self._conditional(key, lambda: self._multipart(key, path, progress, condition))

    def version(self, key: str) -> str | None:
        """The object's ETag (HEAD)."""
        head = self._head(key)
        return None if head is None else str(head["ETag"])

    def replace_file(self, key: str, path: Path, version: str) -> bool:
        """PUT (or complete the multipart upload) with If-Match: the ETag that was hashed."""
        return self._put_file(key, path, None, {"IfMatch": version})

    def _multipart(self, key: str, path: Path, progress: Progress | None, condition: dict[str, str]) -> None:
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
                                                  MultipartUpload={"Parts": parts}, **condition)
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
