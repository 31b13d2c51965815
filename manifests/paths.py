"""Validation of relative file paths inside an artifact: the first line of defence against traversal."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable

_FORBIDDEN_CHARS = ("\\", "\x00")


def _is_drive_path(path: str) -> bool:
    return len(path) >= 2 and path[1] == ":"


def _not_normalised(path: str) -> bool:
    parts = path.split("/")
    return posixpath.normpath(path) != path or "." in parts or "" in parts


# Checked in order; the first that matches is the reason given.
_PATH_CHECKS: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda path: not path, "path is empty"),
    (lambda path: any(char in path for char in _FORBIDDEN_CHARS), "path contains a backslash or NUL byte"),
    (lambda path: path.startswith("/"), "path is absolute"),
    (_is_drive_path, "path has a drive letter"),
    (lambda path: ".." in path.split("/"), "path escapes its folder with '..'"),
    (_not_normalised, "path is not normalised (empty, '.' or repeated '/' components)"),
)


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a safe, normalised, relative POSIX path, or None if it is."""
    return next((reason for check, reason in _PATH_CHECKS if check(path)), None)


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
