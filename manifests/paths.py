"""Validation of relative file paths inside an artifact: the first line of defence against traversal."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

_FORBIDDEN_CHARS = ("\\", "\x00")


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a safe, normalised, relative POSIX path, or None if it is."""
    if not path:
        return "path is empty"
    if any(char in path for char in _FORBIDDEN_CHARS):
        return "path contains a backslash or NUL byte"
    if path.startswith("/"):
        return "path is absolute"
    if len(path) >= 2 and path[1] == ":":
        return "path has a drive letter"
    parts = path.split("/")
    if ".." in parts:
        return "path escapes its folder with '..'"
    if posixpath.normpath(path) != path or "." in parts or "" in parts:
        return "path is not normalised (empty, '.' or repeated '/' components)"
    return None


def collision_problem(paths: Iterable[str]) -> str | None:
    """Why a set of paths is ambiguous (duplicates, case-folding collisions), or None."""
    seen: dict[str, str] = {}
    for path in paths:
        folded = path.casefold()
        if folded in seen:
            other = seen[folded]
            if other == path:
                return f"duplicate path {path!r}"
            return f"paths {other!r} and {path!r} collide on a case-insensitive filesystem"
        seen[folded] = path
    return None
