"""Durable file placement: what POSIX needs so that a file that has a name has its bytes.

A rename or link is atomic but not durable on its own: after a power cut the new name can point
at a file whose data never reached the disk, or the name itself can be lost. So a file's bytes are
fsynced before it gets its final name, and the folder is fsynced after, so that the name is too.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

Writer = Callable[[BinaryIO], object]


def fsync_folder(folder: Path) -> None:
    """Make the names in ``folder`` (a new link, a rename) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temporary(folder: Path, write: Writer, *, prefix: str = ".tmp.", mode: int | None = None) -> Path:
    """A new file in ``folder`` filled by ``write`` and fsynced; the caller gives it its final name."""
    handle, name = tempfile.mkstemp(prefix=prefix, dir=folder)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        if mode is not None:
            os.chmod(name, mode)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably (a reader sees the old bytes or the new)."""
    temporary = write_temporary(path.parent, lambda stream: stream.write(data), prefix=f".{path.name}.")
    try:
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def link_once(temporary: Path, final: Path) -> bool:
    """Give the fsynced ``temporary`` the name ``final`` unless it exists (False then); durable when True."""
    try:
        os.link(temporary, final)  # atomic, and refuses an existing name: write-once
    except FileExistsError:
        return False
    fsync_folder(final.parent)
    return True


def create_file(path: Path, data: bytes) -> bool:
    """Write ``data`` under ``path`` once, durably; False (and nothing written) if the name exists."""
    temporary = write_temporary(path.parent, lambda stream: stream.write(data), prefix=f".{path.name}.")
    try:
        return link_once(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
