"""One commit protocol for every route store: history is the commit point, current a copy for fast reads.

Per route, ``history/<generation>.json`` is written once and first: whoever writes generation N+1
there has committed it (a write-once put is the compare-and-swap). ``current.json`` is then replaced
with the same bytes. A writer that dies between the two leaves current one generation behind:
readers roll forward over history, and the next writer repairs current.

A lost or corrupt history entry never blocks a rollback: history is read tolerantly (an unreadable
entry is left out), the newest generation is always last in it, and the next write rewrites the
current generation's entry from current. Every object is read in canonical form only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from revgate.manifests.errors import ManifestInvalid
from revgate.manifests.route import RouteConflict, RouteSnapshot, check_successor

CURRENT = "current.json"
HISTORY = "history"


def history_name(generation: int) -> str:
    """The object name of a generation's history entry (zero-padded: names sort as numbers)."""
    return f"{HISTORY}/{generation:012d}.json"


def generation_of(name: str) -> int | None:
    """The generation a history entry's file name holds, or None for other names."""
    stem = name.removesuffix(".json")
    return int(stem) if stem != name and stem.isdigit() else None


class RouteObjects(Protocol):
    """The objects of one route in a store; version tags make replacements conditional."""

    route: str

    def where(self, name: str) -> str:
        """Where the object lives, for messages."""
        ...

    def get(self, name: str) -> tuple[bytes, str] | None:
        """The object's bytes and version tag, or None when absent; RouteStoreUnavailable on I/O failure."""
        ...

    def generations(self) -> list[int]:
        """The generations that have a history entry, ascending."""
        ...

    def put_new(self, name: str, data: bytes) -> bool:
        """Write unless the name exists; False (and nothing written) when it does."""
        ...

    def put_over(self, name: str, data: bytes, tag: str | None) -> bool:
        """Replace the object if it still has version ``tag`` (None: if absent); False otherwise."""
        ...


@dataclass(frozen=True)
class Found:
    """One object as read: its snapshot (None if absent or unreadable), version tag, and why unreadable."""

    snapshot: RouteSnapshot | None
    tag: str | None
    error: ManifestInvalid | None = None


def load(objects: RouteObjects, name: str, generation: int | None = None) -> Found:
    """Read and check one object: canonical bytes, this route, and the generation its name says."""
    got = objects.get(name)
    if got is None:
        return Found(None, None)
    data, tag = got
    try:
        snapshot = RouteSnapshot.from_canonical(data, source=objects.where(name))
    except ManifestInvalid as error:
        return Found(None, tag, error)
    wrong = snapshot.route != objects.route or generation not in (None, snapshot.generation)
    if wrong:
        misplaced = ManifestInvalid(f"object holds route {snapshot.route!r} generation {snapshot.generation}",
                                    where=objects.where(name), fix="The entry was moved or copied by hand; restore it.")
        return Found(None, tag, misplaced)
    return Found(snapshot, tag)


def _newest_readable(objects: RouteObjects) -> RouteSnapshot | None:
    for generation in reversed(objects.generations()):
        snapshot = load(objects, history_name(generation), generation).snapshot
        if snapshot is not None:
            return snapshot
    return None


def _roll_forward(objects: RouteObjects, snapshot: RouteSnapshot | None, *, strict: bool) -> RouteSnapshot | None:
    """Follow history past ``snapshot`` (entries a writer committed before it could update current)."""
    while snapshot is not None:
        following = load(objects, history_name(snapshot.generation + 1), snapshot.generation + 1)
        if following.error is not None and strict:
            raise ManifestInvalid(
                f"history entry {snapshot.generation + 1} is newer than current and unreadable, so what "
                f"generation {snapshot.generation + 1} committed is unknown ({following.error.what})",
                where=objects.where(history_name(snapshot.generation + 1)),
                fix="Restore the entry from a backup, or delete it if that generation never served traffic.",
            )
        if following.snapshot is None:
            return snapshot
        snapshot = following.snapshot
    return None


def head(objects: RouteObjects, *, strict: bool = False) -> tuple[RouteSnapshot | None, Found]:
    """The newest committed snapshot and current as read; ManifestInvalid when nothing readable is left."""
    current = load(objects, CURRENT)
    start = current.snapshot
    if start is None:  # current absent or unreadable: history, written first, is at least as new
        start = _newest_readable(objects)
        if start is None and current.error is not None:
            raise current.error
    return _roll_forward(objects, start, strict=strict), current


def read(objects: RouteObjects) -> RouteSnapshot | None:
    """The newest committed snapshot, None for a route that has none."""
    return head(objects)[0]


def history(objects: RouteObjects) -> list[RouteSnapshot]:
    """Every readable committed generation, oldest first, always ending with the newest committed one."""
    entries = [load(objects, history_name(gen), gen).snapshot for gen in objects.generations()]
    snapshots = [snapshot for snapshot in entries if snapshot is not None]
    newest = read(objects)
    if newest is not None and (not snapshots or snapshots[-1].generation < newest.generation):
        snapshots.append(newest)
    return snapshots


def back(objects: RouteObjects) -> Iterator[RouteSnapshot]:
    """The newest committed snapshot, then each older readable generation, read only when asked for.

    A planner that needs the last few generations (a rollback) reads those, not the whole history:
    one GET per generation on S3, and a heartbeat adds a generation per renewal.
    """
    newest = read(objects)
    if newest is None:
        return
    yield newest
    for generation in range(newest.generation - 1, 0, -1):
        snapshot = load(objects, history_name(generation), generation).snapshot
        if snapshot is not None:
            yield snapshot


def _repair(objects: RouteObjects, newest: RouteSnapshot, current: Found) -> str | None:
    """Bring current and the newest generation's history entry back to ``newest``; current's tag after."""
    entry = load(objects, history_name(newest.generation), newest.generation)
    if entry.snapshot is None:
        name = history_name(newest.generation)
        if entry.tag is None:
            objects.put_new(name, newest.canonical())
        else:
            objects.put_over(name, newest.canonical(), entry.tag)
    if current.snapshot == newest:
        return current.tag
    if objects.put_over(CURRENT, newest.canonical(), current.tag):
        return load(objects, CURRENT).tag
    return current.tag  # another writer moved current meanwhile; the commit below decides


def _ours(objects: RouteObjects, name: str, data: bytes) -> bool:
    """Whether the object a conditional write was refused on holds exactly ``data``: this writer's
    own write, landed on an attempt whose answer was lost and retried (a snapshot's bytes name its
    writer and its time, so no other writer's are equal)."""
    found = objects.get(name)
    return found is not None and found[0] == data


def commit(objects: RouteObjects, snapshot: RouteSnapshot) -> None:
    """Commit ``snapshot`` as the next generation; RouteConflict (and no new generation) otherwise."""
    newest, current = head(objects, strict=True)
    check_successor(newest, snapshot, where=objects.where(CURRENT))
    tag = current.tag if newest is None else _repair(objects, newest, current)
    data = snapshot.canonical()
    name = history_name(snapshot.generation)
    if not objects.put_new(name, data) and not _ours(objects, name, data):
        check_successor(read(objects), snapshot, where=objects.where(CURRENT))
        raise RouteConflict("the route changed during the write", where=objects.where(CURRENT),
                            fix="Re-read the route and retry.")
    # Committed. A lost race on current is harmless: a newer writer has moved it on, and readers roll forward.
    objects.put_over(CURRENT, data, tag)
