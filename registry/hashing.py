"""Parallel sha256 over the files of an artifact.

Threads suffice: hashlib releases the GIL while hashing buffers over 2 KiB, so one thread per
core keeps every core busy on multi-file models. Each file is read with one reusable, large
buffer (no per-chunk allocation) and opened without following symlinks.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from revgate.registry.errors import MissingFile, UnsafePath

BUFFER_BYTES = 4 * 1024 * 1024

Progress = Callable[[int], None]


@dataclass(frozen=True)
class FileDigest:
    """Size in bytes and sha256 hex digest of one file's bytes as read."""

    size: int
    sha256: str


def default_workers() -> int:
    """One hashing thread per available core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


def _open_regular(path: Path, where: str) -> int:
    # O_NOFOLLOW refuses a symlink swapped in after the folder was scanned; O_NONBLOCK keeps a FIFO
    # from blocking the open (it is then refused as not regular), and changes nothing for files.
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise MissingFile("pinned file is missing", where=where, fix="Fetch the artifact again.") from None
    except OSError as error:
        raise UnsafePath(
            f"cannot open as a regular file ({error.strerror})",
            where=where,
            fix="Replace symlinks with the real files; artifacts hold regular files only.",
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath("not a regular file", where=where, fix="Artifacts hold regular files only.")
    return fd


def hash_file(path: Path, *, where: str = "", progress: Progress | None = None) -> FileDigest:
    """sha256 and size of the regular file at ``path``; refuses symlinks and special files."""
    fd = _open_regular(path, where or str(path))
    digest = hashlib.sha256()
    buffer = bytearray(BUFFER_BYTES)
    view = memoryview(buffer)
    size = 0
    with os.fdopen(fd, "rb", buffering=0) as stream:
        while count := stream.readinto(view):
            digest.update(view[:count])
            size += count
            if progress is not None:
                progress(count)
    return FileDigest(size=size, sha256=digest.hexdigest())


def hash_tree(
    root: Path,
    relative_paths: Iterable[str],
    *,
    workers: int | None = None,
    progress: Progress | None = None,
) -> Mapping[str, FileDigest]:
    """Digests of the given files under ``root``, hashed in parallel, keyed by relative path."""
    paths = sorted(relative_paths)
    count = max(1, min(workers or default_workers(), len(paths)))
    if count == 1:
        return {path: hash_file(root / path, where=path, progress=progress) for path in paths}
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="sha256") as pool:
        digests = pool.map(lambda path: hash_file(root / path, where=path, progress=progress), paths)
        return dict(zip(paths, digests, strict=True))
