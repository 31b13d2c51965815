"""Request-record objects: one JSON-lines object per router per flush, in a folder or an S3 prefix.

Every router writes its records as whole objects named
``<route>/<kind>/<router>/<written ms, 13 digits>-<boot>-<sequence, 8 digits>-<dropped>.jsonl`` under the store's
root. An object is written once, atomically (a rename in a folder, one PutObject in S3), so a reader
sees all of it or none. Names sort by the time they were written within a router, which lets a reader
list only what is new since its last read (S3's StartAfter) and skip whatever was written before a
stage window opened. The boot (a random tag per router process) and the sequence number make each
name unique and let a reader notice an object that went missing between two it did read; the
router's count of records it dropped so far (its buffer overflowed while the store was down) lets
the reader report those too.

Who wrote what. Each router signs every object with its own key over the object's name and bytes
(:mod:`registry.record_signing` has the format). A reader given the route's routers and their public
keys (``keys``) reads only those routers' folders, and uses an object only once its signature
checks; everything else is reported, never read as evidence:

- ``forged``: under a named router, an object without a valid signature, or with a name no router
  writes. It is reported with its store key and does not move that router's cursor (its name, which
  anyone may choose, can neither skip the router's later objects nor hide a gap in its sequence).
- ``unnamed``: a folder of a router the reader was not given a key for; its objects are counted once
  and not read.
- ``unverified``: under a named router, an object listed and then gone before it could be checked.

Neither is lost evidence: a router's own sequence numbers reveal an object of its that went missing
(``gap``), so an extra object from someone else says nothing about what the router wrote. A reader
given no keys reads every router's folder and trusts what it finds, as a single-machine store can.

The reader here knows JSON lines, the stage window (generations, arrival times) and the names; the
record types belong to the caller, who passes a ``build`` function (``lambda data: RequestRecord(**data)``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Literal, Protocol, TypeVar
from urllib.parse import parse_qs, urlsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from revgate.manifests.errors import RevgateError
from revgate.registry.durable import replace_file
from revgate.registry.record_signing import split_signature, verify_object
from revgate.registry.route_store import check_route

KINDS = ("requests", "paired")
Kind = Literal["requests", "paired"]
_NAME = re.compile(r"^(?P<ms>\d{13})-(?P<boot>[0-9a-z]{1,16})-(?P<seq>\d{8})-(?P<dropped>\d{1,18})\.jsonl$")
ROUTER_ID = _ROUTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
T = TypeVar("T")


class RecordStoreUnavailable(RevgateError):
    """The record store could not be written, listed or read (nothing was half-written)."""


class RecordStoreInvalid(RevgateError):
    """A record store URL, router id or kind that cannot be used."""


def check_router_id(router: str) -> str:
    """A router id usable in an object name: letters, digits, ``.``, ``_``, ``-``."""
    if not _ROUTER.match(router):
        raise RecordStoreInvalid(f"router id {router!r} cannot name record objects", where="--router-id",
                                 fix="Use letters, digits, '.', '_' or '-' (at most 128), e.g. the host name.")
    return router


def _check_kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise RecordStoreInvalid(f"unknown record kind {kind!r}", fix=f"Use one of {', '.join(KINDS)}.")
    return kind  # type: ignore[return-value]


@dataclass(frozen=True, order=True, slots=True)
class ObjectName:
    """Where one flushed batch lives: its route, kind and router, and when and in what order it was written."""

    route: str
    kind: str
    router: str
    written_ms: int
    boot: str
    sequence: int
    dropped: int = 0  # records the router had dropped (since it started) when it wrote this object

    @property
    def file(self) -> str:
        """The last part of the key; names of one router sort by write time."""
        return f"{self.written_ms:013d}-{self.boot}-{self.sequence:08d}-{self.dropped}.jsonl"

    @property
    def key(self) -> str:
        """The key under the store's root."""
        return f"{router_prefix(self.route, self.kind, self.router)}{self.file}"


def router_prefix(route: str, kind: str, router: str) -> str:
    """``<route>/<kind>/<router>/``: one router's objects of one kind."""
    return f"{kind_prefix(route, kind)}{router}/"


def kind_prefix(route: str, kind: str) -> str:
    """``<route>/<kind>/``: every router's objects of one kind."""
    check_route(route)
    return f"{route}/{_check_kind(kind)}/"


def parse_name(route: str, kind: str, router: str, file: str) -> ObjectName | None:
    """The name of an object file, or None for anything else (a temporary file, a stray object)."""
    found = _NAME.match(file)
    if found is None:
        return None
    return ObjectName(route, kind, router, int(found["ms"]), found["boot"], int(found["seq"]), int(found["dropped"]))


class RecordStore(Protocol):
    """Put, list and get whole objects by key; every failure is RecordStoreUnavailable."""

    def where(self, key: str) -> str:
        """A URL or path naming the object, for messages."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Write the object atomically (a reader sees all of it or nothing)."""
        ...

    def children(self, prefix: str) -> list[str]:
        """The names one level below ``prefix`` (which ends in ``/``), sorted."""
        ...

    def files(self, prefix: str, after: str = "") -> list[str]:
        """The file names directly under ``prefix`` that sort after ``after``, sorted."""
        ...

    def get(self, key: str) -> bytes | None:
        """The object's bytes; None when it does not exist."""
        ...


class FolderRecordStore:
    """Objects as files under a folder: the embedded default, one host."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def where(self, key: str) -> str:
        return str(self.root / key)

    def put(self, key: str, data: bytes) -> None:
        path = self.root / key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_file(path, data)  # temporary file, fsync, rename
        except OSError as error:
            raise RecordStoreUnavailable(f"cannot write request records: {error}", where=str(path),
                                         fix="Make the folder writable (or free space); the router keeps "
                                             "serving and retries.") from None

    def children(self, prefix: str) -> list[str]:
        folder = self.root / prefix
        try:
            return sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
        except FileNotFoundError:
            return []
        except OSError as error:
            raise RecordStoreUnavailable(f"cannot list request records: {error}", where=str(folder)) from None

    def files(self, prefix: str, after: str = "") -> list[str]:
        folder = self.root / prefix
        try:
            names = [entry.name for entry in os.scandir(folder) if entry.is_file()]
        except FileNotFoundError:
            return []
        except OSError as error:
            raise RecordStoreUnavailable(f"cannot list request records: {error}", where=str(folder)) from None
        return sorted(name for name in names if not name.startswith(".") and name > after)

    def get(self, key: str) -> bytes | None:
        path = self.root / key
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise RecordStoreUnavailable(f"cannot read request records: {error}", where=str(path)) from None


class S3RecordStore:
    """Objects in an S3 bucket under a prefix: routers on several hosts feed one stage."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client: Any = None,
                 timeout_s: float = 5.0) -> None:
        import boto3  # deferred: only S3 users pay for importing boto3
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        # Short timeouts and few retries: a router's flush must fail fast and retry on its next tick.
        config = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 2})
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url, config=config)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def put(self, key: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                   ContentType="application/x-ndjson")
        except (ClientError, BotoCoreError) as error:
            raise RecordStoreUnavailable(f"cannot write request records: {error}", where=self.where(key),
                                         fix="Check the endpoint, bucket and credentials; the router keeps "
                                             "serving and retries.") from None

    def children(self, prefix: str) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._key(prefix)
        found: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full,
                                                                            Delimiter="/")
            for page in pages:
                found.extend(item["Prefix"][len(full):].rstrip("/") for item in page.get("CommonPrefixes", []))
        except (ClientError, BotoCoreError) as error:
            raise RecordStoreUnavailable(f"cannot list request records: {error}", where=self.where(prefix)) from None
        return sorted(found)

    def files(self, prefix: str, after: str = "") -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._key(prefix)
        start = {"StartAfter": full + after} if after else {}
        found: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full,
                                                                            Delimiter="/", **start)
            for page in pages:
                found.extend(item["Key"][len(full):] for item in page.get("Contents", []))
        except (ClientError, BotoCoreError) as error:
            raise RecordStoreUnavailable(f"cannot list request records: {error}", where=self.where(prefix)) from None
        return sorted(name for name in found if name > after)

    def get(self, key: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
            data: bytes = response["Body"].read()
            return data
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise RecordStoreUnavailable(f"cannot read request records: {error}", where=self.where(key)) from None
        except BotoCoreError as error:
            raise RecordStoreUnavailable(f"cannot read request records: {error}", where=self.where(key)) from None


def open_record_store(url: str) -> RecordStore:
    """A store from ``s3://BUCKET/PREFIX[?endpoint_url=...]``, ``file:///DIR`` or a plain folder."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise RecordStoreInvalid("S3 record store URL names no bucket", where=url, fix="Use s3://BUCKET/PREFIX.")
        endpoint = parse_qs(parts.query).get("endpoint_url", [None])[0]
        return S3RecordStore(parts.netloc, parts.path, endpoint_url=endpoint)
    if parts.scheme in ("file", ""):
        if not (parts.path if parts.scheme else url):
            raise RecordStoreInvalid("empty record store path", where="--records-sink",
                                     fix="Give a folder or an s3:// URL.")
        return FolderRecordStore(Path(parts.path if parts.scheme else url))
    raise RecordStoreInvalid(f"unsupported record store scheme {parts.scheme!r}", where=url,
                             fix="Use a folder, file:///DIR or s3://BUCKET/PREFIX.")


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageWindow:
    """One stage's records: generations in ``[first_generation, last_generation]``, arrivals in ``[since_s, until_s)``.

    A bound left as None is open. Records without an ``arrival_s`` (paired records) are judged by
    generation alone.
    """

    first_generation: int | None = None
    last_generation: int | None = None
    since_s: float | None = None
    until_s: float | None = None

    def holds(self, data: dict[str, Any]) -> bool:
        """Whether one record's JSON object falls inside the window."""
        generation = data.get("generation")
        first, last = self.first_generation, self.last_generation
        if first is not None or last is not None:
            if not isinstance(generation, int):
                return False
            if (first is not None and generation < first) or (last is not None and generation > last):
                return False
        arrival = data.get("arrival_s")
        if not isinstance(arrival, int | float):
            return True
        if self.since_s is not None and arrival < self.since_s:
            return False
        return self.until_s is None or arrival < self.until_s

    def first_file(self) -> str:
        """Objects written before the window opened hold no record of it (a record is written after it arrives)."""
        return "" if self.since_s is None else f"{int(self.since_s * 1000):013d}"


ProblemKind = Literal["missing", "corrupt", "unreadable", "gap", "dropped", "forged", "unnamed", "unverified"]
REFUSED: tuple[ProblemKind, ...] = ("forged", "unnamed", "unverified")  # not the routers' evidence: never lost


@dataclass(frozen=True, slots=True)
class ObjectProblem:
    """An object the reader could not use in full (evidence missing, never a pass), or refused (``REFUSED``)."""

    router: str
    where: str
    kind: ProblemKind
    detail: str
    count: int = 0  # objects missing from a gap, records dropped


@dataclass(frozen=True, slots=True)
class RecordsRead(Generic[T]):
    """What one incremental read found: the new records in the window, counted per router, and every problem."""

    records: list[T]
    per_router: dict[str, int]
    objects: int
    problems: list[ObjectProblem] = field(default_factory=list)
    origins: list[tuple[str, str]] = field(default_factory=list)  # per record: its router and object

    @property
    def dropped(self) -> dict[str, int]:
        """Records each router reported dropped (from its buffer, while its store was down), per router."""
        found: dict[str, int] = {}
        for problem in self.problems:
            if problem.kind == "dropped":
                found[problem.router] = found.get(problem.router, 0) + problem.count
        return found


@dataclass(slots=True)
class _Cursor:
    file: str = ""  # the last object file read in full
    boot: str = ""
    sequence: int = -1
    dropped: int = 0
    refused: set[str] = field(default_factory=set)  # files refused (forged), listed again but never re-read


class RecordReader(Generic[T]):
    """Reads one route's records of one kind incrementally: each ``read`` returns only objects not read before.

    Without ``keys``, routers are found by listing (a router that starts later is picked up by the
    next read), or fixed by ``routers``. With ``keys`` (router id: public key), only those routers
    are read, each object only once its signature checks; other routers' folders are reported as
    ``unnamed``. An object that cannot be fetched stops that router's cursor before it, so the next
    read tries it again; a corrupt line or a gap in a router's sequence is reported.
    """

    def __init__(self, store: RecordStore, route: str, kind: str, build: Callable[[dict[str, Any]], T], *,
                 routers: Iterable[str] | None = None, keys: Mapping[str, Ed25519PublicKey] | None = None) -> None:
        self.store, self.route, self.kind, self.build = store, route, _check_kind(kind), build
        self.keys = None if keys is None else {check_router_id(router): key for router, key in keys.items()}
        if routers is None and self.keys is not None:
            routers = self.keys
        self.routers = None if routers is None else [check_router_id(item) for item in routers]
        if self.keys is not None and self.routers is not None:
            unkeyed = sorted(set(self.routers) - set(self.keys))
            if unkeyed:
                raise RecordStoreInvalid(f"no public key for router(s) {', '.join(unkeyed)}", where="record_signers",
                                         fix="Name each router the route reads with its public key.")
        self.cursors: dict[str, _Cursor] = {}
        self.totals: dict[str, int] = {}  # records returned so far, per router
        self.unnamed: set[str] = set()  # folders of routers without a key, reported once each

    def read(self, window: StageWindow | None = None) -> RecordsRead[T]:
        """The new records inside ``window``; RecordStoreUnavailable when the store cannot be listed."""
        window = window or StageWindow()
        routers = self.routers if self.routers is not None else self.store.children(kind_prefix(self.route, self.kind))
        found: RecordsRead[T] = RecordsRead([], {}, 0)  # filled in place; its object count at the end
        if self.keys is not None:
            self._unnamed(window, found.problems)
        objects = 0
        for router in routers:
            if not _ROUTER.match(router):
                continue  # not a router's folder
            count, read = self._read_router(router, window, found)
            objects += read
            found.per_router[router] = count
            self.totals[router] = self.totals.get(router, 0) + count
        return replace(found, objects=objects)

    def _unnamed(self, window: StageWindow, problems: list[ObjectProblem]) -> None:
        """Report, once each, the folders of routers the reader has no key for; their objects are not read."""
        prefix = kind_prefix(self.route, self.kind)
        for router in self.store.children(prefix):
            if router in (self.keys or {}) or router in self.unnamed:
                continue
            self.unnamed.add(router)
            count = len(self.store.files(f"{prefix}{router}/", window.first_file()))
            problems.append(ObjectProblem(router, self.store.where(f"{prefix}{router}/"), "unnamed",
                                          f"a router not named among the route's record signers: its {count} "
                                          "object(s) are not read", count))

    def _read_router(self, router: str, window: StageWindow, found: RecordsRead[T]) -> tuple[int, int]:
        problems = found.problems
        cursor = self.cursors.setdefault(router, _Cursor())
        prefix = router_prefix(self.route, self.kind, router)
        count = objects = 0
        first = window.first_file()
        if first > cursor.file:
            cursor.boot = ""  # objects skipped by the window are no gap
        key = None if self.keys is None else self.keys.get(router)
        for file in self.store.files(prefix, max(cursor.file, first)):
            if file in cursor.refused:
                continue
            name = parse_name(self.route, self.kind, router, file)
            where = self.store.where(prefix + file)
            if name is None:
                # Anyone may choose a name: one sorting after the router's own must not skip them.
                kind: ProblemKind = "corrupt" if key is None else "forged"
                problems.append(ObjectProblem(router, where, kind, "not a record object's name"))
                cursor.refused.add(file)
                continue
            try:
                data = self.store.get(name.key)
            except RecordStoreUnavailable as error:
                problems.append(ObjectProblem(router, where, "unreadable", f"{error}; read again next time"))
                break
            if data is None and key is not None:
                # Its name is unverified: it moves no cursor, and if it was the router's, a gap shows it.
                problems.append(ObjectProblem(router, where, "unverified", "listed, then gone before it was read"))
                cursor.refused.add(file)
                continue
            if data is None:
                problems.append(ObjectProblem(router, where, "missing", "listed, then gone before it was read"))
            else:
                body, refused = split_signature(data)[0], ""
                if key is not None:
                    body, refused = verify_object(key, name.key, data)
                if refused:
                    problems.append(ObjectProblem(router, where, "forged", f"refused, not read: {refused}"))
                    cursor.refused.add(file)  # and the cursor stays: a forged name moves nothing
                    continue
                count += self._parse(body, window, found, (router, where))
                objects += 1
            self._advance(cursor, name, router, where, problems)
        return count, objects

    @staticmethod
    def _advance(cursor: _Cursor, name: ObjectName, router: str, where: str, problems: list[ObjectProblem]) -> None:
        known = cursor.boot == name.boot
        if known and name.sequence > cursor.sequence + 1:
            missing = name.sequence - cursor.sequence - 1
            problems.append(ObjectProblem(router, where, "gap",
                                          f"{missing} object(s) of this router missing before this one", missing))
        dropped = name.dropped - (cursor.dropped if known else 0)
        if dropped > 0:
            since = "since the object before" if known else "since it started (some perhaps before this window)"
            problems.append(ObjectProblem(router, where, "dropped",
                                          f"the router dropped {dropped} record(s) {since}", dropped))
        cursor.file, cursor.boot, cursor.sequence, cursor.dropped = name.file, name.boot, name.sequence, name.dropped

    def _parse(self, data: bytes, window: StageWindow, found: RecordsRead[T], origin: tuple[str, str]) -> int:
        router, where = origin
        records, problems = found.records, found.problems
        count = 0
        for number, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                if not isinstance(item, dict):
                    raise TypeError("a line is not a JSON object")
                if not window.holds(item):
                    continue
                records.append(self.build(item))
                found.origins.append(origin)
            except (ValueError, TypeError) as error:
                problems.append(ObjectProblem(router, where, "corrupt", f"line {number}: {error}"))
                continue
            count += 1
        return count
