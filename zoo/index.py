"""Reading a built zoo: its index (``zoo.json``) and the revisions it records.

Kept apart from the builder so that readers do not load torch and edits here do not change the
zoo's cache key.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from revgate.manifests.errors import RevgateError

INDEX_FILE = "zoo.json"


class ZooError(RevgateError):
    """The zoo could not be built or read."""


@dataclass(frozen=True, slots=True)
class ZooRevision:
    """One built revision as the index records it."""

    name: str
    kind: str
    parent: str | None
    path: str
    artifact_digest: str
    base_artifact: str | None
    purpose: str


def read_index(out_dir: Path) -> dict[str, Any]:
    """The zoo's index document; a clear error if there is none."""
    path = out_dir / INDEX_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ZooError("no model zoo here", where=str(path), fix="Run `revgate models make DIR` first.") from None
    return data


def load_revisions(out_dir: Path) -> dict[str, ZooRevision]:
    """The revisions recorded in the zoo's index, in build order (stable first)."""
    index = read_index(out_dir)
    order = [spec["name"] for spec in index["recipe"]["revisions"]]
    return {name: ZooRevision(**index["revisions"][name]) for name in order}


@contextlib.contextmanager
def folder_lock(out_dir: Path) -> Iterator[None]:
    """One writer per folder at a time (several test runs and the demo may start together)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with (out_dir.parent / f".{out_dir.name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
