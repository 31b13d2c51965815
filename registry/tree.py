"""Listing an artifact folder: regular files only, no symlinks, no special files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from revgate.manifests.artifact import ArtifactManifest, Role
from revgate.manifests.paths import collision_problem, path_problem
from revgate.registry.errors import UnsafePath

_FIX = "Artifacts hold regular files only: replace symlinks with the files they point to, remove the rest."


def _describe(mode: int) -> str | None:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        return None
    return "special file (device, socket or pipe)"


def _walk(root: Path, prefix: str, found: list[str]) -> None:
    with os.scandir(root / prefix if prefix else root) as entries:
        for entry in entries:
            relative = f"{prefix}/{entry.name}" if prefix else entry.name
            mode = entry.stat(follow_symlinks=False).st_mode
            problem = _describe(mode)
            if problem:
                raise UnsafePath(f"artifact folder contains a {problem}", where=relative, fix=_FIX)
            if stat.S_ISDIR(mode):
                _walk(root, relative, found)
            else:
                found.append(relative)


def is_single_file(path: Path) -> bool:
    """Whether ``path`` is a single-file artifact (a GGUF file, say) rather than a folder."""
    return path.is_file() and not path.is_symlink()


def artifact_root(path: Path) -> Path:
    """The folder an artifact's relative paths start from: the folder itself, or a single file's folder."""
    return path.parent if is_single_file(path) else path


def list_files(root: Path) -> tuple[str, ...]:
    """Every regular file of the artifact at ``root`` as sorted relative POSIX paths.

    ``root`` is a folder, or one regular file (a single-file artifact, listed as its own name).
    Refuses symlinks, special files, unsafe names and names that collide.
    """
    if is_single_file(root):
        found = [root.name]
    elif root.is_symlink() or not root.is_dir():
        raise UnsafePath("artifact is neither a folder nor a regular file", where=str(root),
                         fix="Pass the model folder, or the model's one file.")
    else:
        found = []
        _walk(root, "", found)
    for path in found:
        problem = path_problem(path)
        if problem:
            raise UnsafePath(problem, where=path, fix="Rename the file to a plain relative path.")
    collision = collision_problem(found)
    if collision:
        raise UnsafePath(collision, where=str(root), fix="Rename one of the files.")
    return tuple(sorted(found))


def served_path(folder: Path, manifest: ArtifactManifest) -> Path:
    """What the engine loads from a pulled artifact: the one weights file of a single-file artifact, else the folder."""
    entries = manifest.entries
    single = len(entries) == 1 and "/" not in entries[0].path and entries[0].role is Role.WEIGHTS
    return folder / entries[0].path if single else folder
