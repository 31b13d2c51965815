"""Verified bytes that nothing can change under a replica.

After verification the cache entry is made read-only (files 0444, folders 0555) and every file is
hard-linked into a folder of the replica's own, which is what vLLM loads. Verification hashes that
folder, so a later rename, replacement or quarantine of the cache entry never reaches it. An
in-place write (by someone allowed to write a read-only file, root or the owner after a chmod)
would reach the shared inode, so the agent re-checks the replica's files (inode, size, mtime) once
vLLM has read them, and fails the replica if they moved.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from revgate.manifests.errors import RevgateError
from revgate.registry.tree import list_files

READ_ONLY_FILE = 0o444
READ_ONLY_DIR = 0o555
WRITABLE_DIR = 0o755


class ArtifactChanged(RevgateError):
    """A verified file changed after verification, while the engine was loading it."""


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What a write to a file changes: its inode (a replacement), size and modification time.

    The change time is left out: linking the same inode into another replica's folder moves it.
    """

    inode: int
    size: int
    mtime_ns: int


def _folders(root: Path) -> list[Path]:
    return [Path(top) for top, _, _ in os.walk(root)]


def seal(root: Path) -> None:
    """Make every file under ``root`` 0444 and every folder 0555 (``root`` included; a symlink is left
    alone, for verification to refuse)."""
    if root.is_symlink():
        return
    for folder in _folders(root):
        for entry in os.scandir(folder):
            if entry.is_file(follow_symlinks=False):
                os.chmod(entry.path, READ_ONLY_FILE)
    for folder in reversed(_folders(root)):
        folder.chmod(READ_ONLY_DIR)


def unseal_folders(root: Path) -> None:
    """Make the folders under ``root`` writable again (to move or remove them); files stay read-only."""
    if root.is_dir() and not root.is_symlink():
        root.chmod(WRITABLE_DIR)
        for folder in _folders(root):
            folder.chmod(WRITABLE_DIR)


def remove_tree(root: Path) -> None:
    """Remove a sealed folder (a missing one is fine)."""
    if not root.exists():
        return
    unseal_folders(root)
    shutil.rmtree(root)


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copy2(source, target, follow_symlinks=False)  # another filesystem: a private copy


def link_tree(source: Path, target: Path) -> Path:
    """Hard-link every regular file of ``source`` into a new folder ``target`` (staged, then renamed).

    Symlinks and special files are refused (``UnsafePath``) exactly as verification refuses them.
    """
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    remove_tree(staging)
    try:
        for relative in list_files(source):
            destination = staging / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(source / relative, destination)
        staging.mkdir(parents=True, exist_ok=True)  # an empty artifact still gets its folder
        os.rename(staging, target)
    except BaseException:
        remove_tree(staging)
        raise
    seal(target)
    return target


def stamps(root: Path) -> dict[str, FileStamp]:
    """Each file's stamp, by relative path."""
    found = {}
    for relative in list_files(root):
        info = (root / relative).stat(follow_symlinks=False)
        found[relative] = FileStamp(info.st_ino, info.st_size, info.st_mtime_ns)
    return found


def recheck(root: Path, verified: dict[str, FileStamp]) -> None:
    """Raise :class:`ArtifactChanged` unless every file under ``root`` is as it was when verified."""
    now = stamps(root)
    changed = sorted(path for path in verified.keys() | now.keys() if verified.get(path) != now.get(path))
    if changed:
        raise ArtifactChanged(
            "verified files changed while the engine was loading them; the replica was not published",
            where=", ".join(f"{root}/{path}" for path in changed[:5]),
            fix="Find what writes into the worker's cache and stop it; the next start verifies afresh.",
        )


def is_read_only(root: Path) -> bool:
    """Whether every file under ``root`` is 0444 and every folder 0555."""
    modes = [stat.S_IMODE(folder.stat().st_mode) == READ_ONLY_DIR for folder in _folders(root)]
    modes += [stat.S_IMODE((root / path).stat().st_mode) == READ_ONLY_FILE for path in list_files(root)]
    return all(modes)
