"""The S3 route store: compare-and-swap by conditional writes (If-None-Match / If-Match).

Its safety rests on the endpoint honouring those headers. Some S3-compatible servers accept and
ignore them, and then two writers could both commit a generation; so before the first write the
store probes the endpoint once and refuses one that ignores them.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from revgate.manifests.route import ROUTE_NAME, RouteSnapshot, RouteStoreUnavailable
from revgate.registry import route_log
from revgate.registry.route_store import check_route

_REFUSED = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})


class ConditionalWritesIgnored(RouteStoreUnavailable):
    """The S3 endpoint accepted a write whose If-None-Match / If-Match condition did not hold."""


def _refused(error: ClientError) -> bool:
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return error.response.get("Error", {}).get("Code") in _REFUSED or status in (409, 412)


class S3Objects:
    """One route's objects under a bucket and prefix; version tags are ETags."""

    def __init__(self, client: Any, bucket: str, prefix: str, route: str) -> None:
        self.client = client
        self.bucket = bucket
        self.base = "/".join(part for part in (prefix, route) if part)
        self.route = route

    def _key(self, name: str) -> str:
        return f"{self.base}/{name}"

    def where(self, name: str) -> str:
        """The object's S3 URL."""
        return f"s3://{self.bucket}/{self._key(name)}"

    def get(self, name: str) -> tuple[bytes, str] | None:
        """GET the object and its ETag."""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
            return response["Body"].read(), str(response["ETag"])
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise RouteStoreUnavailable(f"cannot read route snapshot: {error}", where=self.where(name)) from None
        except BotoCoreError as error:
            raise RouteStoreUnavailable(f"cannot reach the route store: {error}", where=self.where(name)) from None

    def generations(self) -> list[int]:
        """Generations with a history object (one LIST, paginated)."""
        prefix = self._key(route_log.HISTORY + "/")
        found: list[int] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                names = (item["Key"].removeprefix(prefix) for item in page.get("Contents", []))
                found.extend(gen for gen in map(route_log.generation_of, names) if gen is not None)
        except (ClientError, BotoCoreError) as error:
            raise RouteStoreUnavailable(f"cannot list route history: {error}", where=self.where("history/")) from None
        return sorted(found)

    def put_new(self, name: str, data: bytes) -> bool:
        """PUT with If-None-Match: *."""
        return put(self.client, self.bucket, self._key(name), data, {"IfNoneMatch": "*"})

    def put_over(self, name: str, data: bytes, tag: str | None) -> bool:
        """PUT with If-Match: tag (If-None-Match: * when there was no object)."""
        condition = {"IfMatch": tag} if tag else {"IfNoneMatch": "*"}
        return put(self.client, self.bucket, self._key(name), data, condition)


def put(client: Any, bucket: str, key: str, data: bytes, condition: dict[str, str]) -> bool:
    """Conditional PUT; False when the precondition failed (someone else wrote first)."""
    where = f"s3://{bucket}/{key}"
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/json", **condition)
    except ClientError as error:
        if _refused(error):
            return False
        raise RouteStoreUnavailable(f"cannot write route snapshot: {error}", where=where) from None
    except BotoCoreError as error:
        raise RouteStoreUnavailable(f"cannot reach the route store: {error}", where=where) from None
    return True


def check_conditional_writes(client: Any, bucket: str, prefix: str) -> None:
    """Refuse an endpoint that ignores If-None-Match or If-Match (ConditionalWritesIgnored)."""
    key = "/".join(part for part in (prefix, f".revgate-probe/{uuid.uuid4().hex}") if part)
    try:
        if not put(client, bucket, key, b"first", {"IfNoneMatch": "*"}):
            raise RouteStoreUnavailable("a new probe object was refused", where=f"s3://{bucket}/{key}",
                                        fix="Check the bucket's permissions and retry.")
        ignored = [header for header, condition in (("If-None-Match", {"IfNoneMatch": "*"}),
                                                    ("If-Match", {"IfMatch": '"00000000000000000000000000000000"'}))
                   if put(client, bucket, key, b"second", condition)]
    finally:
        with contextlib.suppress(ClientError, BotoCoreError):  # a leftover probe is harmless: its name is unique
            client.delete_object(Bucket=bucket, Key=key)
    if ignored:
        raise ConditionalWritesIgnored(
            f"the S3 endpoint ignores {' and '.join(ignored)}: it overwrote an object whose write condition "
            "did not hold, so compare-and-swap on routes would not be safe",
            where=f"s3://{bucket}/{prefix}",
            fix="Use an S3 service that honours conditional writes (AWS S3, or a server version that supports "
                "If-None-Match and If-Match on PUT), or the file route store on one host.",
        )


# A route store that does not answer must fail fast: a router's poll and the flow's writes wait on
# it (boto3's defaults, 60 s per read and 5 attempts, held both for minutes). Standard retries: a
# retried conditional write that had landed is told from a conflict by route_log.commit.
TIMEOUT_S = 5.0
ATTEMPTS = 3


def client_config() -> Config:
    """The route store's botocore settings: short timeouts, a few standard retries."""
    return Config(connect_timeout=TIMEOUT_S, read_timeout=TIMEOUT_S,
                  retries={"max_attempts": ATTEMPTS, "mode": "standard"})


class S3RouteStore:
    """Snapshots in an S3 bucket; compare-and-swap by conditional writes, probed before the first write."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url, config=client_config())
        self._checked = False

    def _objects(self, route: str) -> S3Objects:
        check_route(route)
        return S3Objects(self.client, self.bucket, self.prefix, route)

    def check_conditional_writes(self) -> None:
        """Probe the endpoint once: ConditionalWritesIgnored when it ignores If-None-Match or If-Match."""
        if not self._checked:
            check_conditional_writes(self.client, self.bucket, self.prefix)
            self._checked = True

    def read(self, route: str) -> RouteSnapshot | None:
        """The newest committed snapshot, None when the route has none; ManifestInvalid when none is readable."""
        return route_log.read(self._objects(route))

    def write(self, snapshot: RouteSnapshot) -> None:
        """Commit the next generation; RouteConflict (and nothing changed) on a stale generation."""
        self.check_conditional_writes()
        route_log.commit(self._objects(snapshot.route), snapshot)

    def history(self, route: str) -> list[RouteSnapshot]:
        """Every readable committed generation, oldest first, ending with the newest."""
        return route_log.history(self._objects(route))

    def back(self, route: str) -> Iterator[RouteSnapshot]:
        """The newest committed snapshot, then older generations, each read only when asked for."""
        return route_log.back(self._objects(route))

    def routes(self) -> list[str]:
        """The routes with at least one committed generation, sorted (LISTs by delimiter, paginated)."""
        base = f"{self.prefix}/" if self.prefix else ""
        names: list[str] = []
        try:
            listing = self.client.get_paginator("list_objects_v2")
            for page in listing.paginate(Bucket=self.bucket, Prefix=base, Delimiter="/"):
                names.extend(item["Prefix"].removeprefix(base).rstrip("/") for item in page.get("CommonPrefixes", []))
        except (ClientError, BotoCoreError) as error:
            raise RouteStoreUnavailable(f"cannot list routes: {error}", where=f"s3://{self.bucket}/{base}") from None
        return sorted(name for name in names if ROUTE_NAME.match(name) and self._objects(name).generations())
