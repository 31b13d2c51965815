"""One live worker agent per cache folder.

An agent removes the replica folders it finds at start (an earlier agent's, none of whose replicas
runs any more). A second agent on the same folder would remove a live agent's replicas under it:
vLLM then fails on the next load with an unrelated error. The lock is an ``flock`` on a file in the
folder, released by the kernel when the holder exits however it exits, so a crashed agent never
leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from revgate.manifests.errors import RevgateError

LOCK_NAME = "agent.lock"


class CacheHeld(RevgateError):
    """Another live worker agent holds this cache folder."""


@contextlib.contextmanager
def hold_cache(cache: Path) -> Iterator[None]:
    """Hold ``cache`` for this process's agent, or raise :class:`CacheHeld` naming the holder."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / LOCK_NAME
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 64, 0).decode(errors="replace").strip() or "unknown"
            raise CacheHeld(
                f"another worker agent (pid {holder}) holds the cache folder {cache}",
                where=str(path),
                fix="Stop that agent first, or give this one its own --cache folder.",
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)  # releases the lock
