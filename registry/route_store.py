"""Route stores: a local file store (the embedded default) and an S3 store, both compare-and-swap.

Layout, the same in both: ``<route>/current.json`` is the committed snapshot (the commit point);
``<route>/history/<generation>.json`` keeps every committed generation. A write first repairs a
history entry missing for the current generation (a writer that died after its commit), then
commits, then appends its own history entry, so history is complete and append-only.

Deliberately free of model_signing, sigstore and mlflow: the router imports this module.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from manifests.route import (
    ROUTE_NAME,
    RouteConflict,
    RouteSnapshot,
    RouteStore,
    RouteStoreUnavailable,
    check_successor,
)

CURRENT = "current.json"


def _history_name(generation: int) -> str:
    return f"history/{generation:012d}.json"


def _check_route(route: str) -> None:
    if not ROUTE_NAME.match(route):
        raise RouteStoreUnavailable(
            f"route name {route!r} is not valid", fix="Use 1-63 of a-z 0-9 . _ - starting with a letter or digit."
        )


class FileRouteStore:
    """Snapshots in a directory; writes are atomic renames under an exclusive lock file."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _dir(self, route: str) -> Path:
        _check_route(route)
        return self.root / route

    def read(self, route: str) -> RouteSnapshot | None:
        """The current snapshot, None when the route has none; ManifestInvalid when corrupt."""
        path = self._dir(route) / CURRENT
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise RouteStoreUnavailable(f"cannot read route snapshot: {error}", where=str(path)) from None
        return RouteSnapshot.from_json(data, source=str(path))

    def write(self, snapshot: RouteSnapshot) -> None:
        """Commit the next generation; RouteConflict (and nothing changed) on a stale generation."""
        folder = self._dir(snapshot.route)
        with self._locked(folder):
            current = self.read(snapshot.route)
            check_successor(current, snapshot, where=str(folder / CURRENT))
            if current is not None:
                self._append_history(folder, current)
            _atomic_write(folder / CURRENT, snapshot.canonical())
            self._append_history(folder, snapshot)

    def history(self, route: str) -> list[RouteSnapshot]:
        """Every committed generation, oldest first."""
        folder = self._dir(route) / "history"
        names = sorted(path.name for path in folder.glob("*.json")) if folder.is_dir() else []
        return [RouteSnapshot.from_json((folder / name).read_bytes(), source=str(folder / name)) for name in names]

    def _append_history(self, folder: Path, snapshot: RouteSnapshot) -> None:
        path = folder / _history_name(snapshot.generation)
        if not path.exists():
            _atomic_write(path, snapshot.canonical())

    @contextmanager
    def _locked(self, folder: Path) -> Iterator[None]:
        try:
            (folder / "history").mkdir(parents=True, exist_ok=True)
            handle = (folder / ".lock").open("a")
        except OSError as error:
            raise RouteStoreUnavailable(f"cannot lock route folder: {error}", where=str(folder)) from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, fsync, then rename over ``path``."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class S3RouteStore:
    """Snapshots in an S3 bucket; compare-and-swap by conditional writes (If-Match / If-None-Match)."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client: Any = None) -> None:
        import boto3  # deferred: only S3 users pay for importing boto3

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url)

    def _key(self, route: str, name: str) -> str:
        _check_route(route)
        return "/".join(part for part in (self.prefix, route, name) if part)

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def read(self, route: str) -> RouteSnapshot | None:
        """The current snapshot, None when the route has none; ManifestInvalid when corrupt."""
        found = self._get(self._key(route, CURRENT))
        return None if found is None else found[0]

    def _get(self, key: str) -> tuple[RouteSnapshot, str] | None:
        from botocore.exceptions import BotoCoreError, ClientError  # as boto3

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            data = response["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise RouteStoreUnavailable(f"cannot read route snapshot: {error}", where=self._where(key)) from None
        except BotoCoreError as error:
            raise RouteStoreUnavailable(f"cannot reach the route store: {error}", where=self._where(key)) from None
        return RouteSnapshot.from_json(data, source=self._where(key)), str(response["ETag"])

    def write(self, snapshot: RouteSnapshot) -> None:
        """Commit the next generation; RouteConflict (and nothing changed) on a stale generation."""
        key = self._key(snapshot.route, CURRENT)
        found = self._get(key)
        current, etag = found if found is not None else (None, None)
        check_successor(current, snapshot, where=self._where(key))
        if current is not None:
            self._append_history(current)
        condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        if not self._put(key, snapshot.canonical(), condition):
            latest = self.read(snapshot.route)
            check_successor(latest, snapshot, where=self._where(key))
            raise RouteConflict("the route changed during the write", where=self._where(key), fix="Re-read and retry.")
        self._append_history(snapshot)

    def history(self, route: str) -> list[RouteSnapshot]:
        """Every committed generation, oldest first."""
        prefix = self._key(route, "history/")
        keys: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(item["Key"] for item in page.get("Contents", []))
        snapshots = [self._get(key) for key in sorted(keys)]
        return [found[0] for found in snapshots if found is not None]

    def _append_history(self, snapshot: RouteSnapshot) -> None:
        # If-None-Match: history entries are written once; a 412 means it is already there.
        key = self._key(snapshot.route, _history_name(snapshot.generation))
        self._put(key, snapshot.canonical(), {"IfNoneMatch": "*"})

    def _put(self, key: str, data: bytes, condition: dict[str, str]) -> bool:
        """Conditional put; False when the precondition failed (someone else wrote first)."""
        from botocore.exceptions import BotoCoreError, ClientError  # as boto3

        try:
            self.client.put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentType="application/json", **condition
            )
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                return False
            raise RouteStoreUnavailable(f"cannot write route snapshot: {error}", where=self._where(key)) from None
        except BotoCoreError as error:
            raise RouteStoreUnavailable(f"cannot reach the route store: {error}", where=self._where(key)) from None
        return True


def open_route_store(url: str) -> RouteStore:
    """A store from a URL: ``s3://bucket/prefix[?endpoint_url=...]``, ``file:///dir`` or a plain directory."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise RouteStoreUnavailable("S3 route store URL names no bucket", where=url, fix="Use s3://BUCKET/PREFIX.")
        endpoint = parse_qs(parts.query).get("endpoint_url", [None])[0]
        return S3RouteStore(parts.netloc, parts.path, endpoint_url=endpoint)
    if parts.scheme in ("file", ""):
        return FileRouteStore(Path(parts.path if parts.scheme else url))
    raise RouteStoreUnavailable(
        f"unsupported route store scheme {parts.scheme!r}", where=url, fix="Use a directory, file:///DIR or s3://BUCKET/PREFIX."
    )
