"""Validation of relative file paths inside an artifact: the first line of defence against traversal."""

from __future__ import annotations

import posixpath
import unicodedata
from collections.abc import Callable, Iterable

_FORBIDDEN_CHARS = ("\\", "\x00")
# Bidirectional overrides and isolates make a listed name read differently from the name on disk.
_BIDI_CONTROLS = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _has_control(path: str) -> bool:
    # Cc: C0/C1 controls (newline, escape, DEL); Cs: lone surrogates, which no file system can store.
    return any(unicodedata.category(char) in ("Cc", "Cs") or char in _BIDI_CONTROLS for char in path)


def _is_drive_path(path: str) -> bool:
    return len(path) >= 2 and path[1] == ":"


def _not_normalised(path: str) -> bool:
    parts = path.split("/")
    return posixpath.normpath(path) != path or "." in parts or "" in parts


# Checked in order; the first that matches is the reason given.
_PATH_CHECKS: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda path: not path, "path is empty"),
    (lambda path: any(char in path for char in _FORBIDDEN_CHARS), "path contains a backslash or NUL byte"),
    (_has_control, "path contains a control character (newline, escape, bidirectional override)"),
    (lambda path: path.startswith("/"), "path is absolute"),
    (_is_drive_path, "path has a drive letter"),
    (lambda path: ".." in path.split("/"), "path escapes its folder with '..'"),
    (_not_normalised, "path is not normalised (empty, '.' or repeated '/' components)"),
)


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a safe, normalised, relative POSIX path, or None if it is."""
    return next((reason for check, reason in _PATH_CHECKS if check(path)), None)


def folded(path: str) -> str:
    """The name a case-insensitive, Unicode-normalising file system (macOS, Windows) would see."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", path).casefold())


def _folders(path: str) -> Iterable[str]:
    parts = path.split("/")
    return ("/".join(parts[:end]) for end in range(1, len(parts)))


def collision_problem(paths: Iterable[str]) -> str | None:
    """Why a set of paths is ambiguous, or None.

    Refused: duplicates; names that collide once case-folded or Unicode-normalised (NFC), as they
    would on macOS or Windows; and a file ``a`` beside a folder ``a/b``, which no file system holds.
    """
    seen: dict[str, str] = {}
    folders: dict[str, str] = {}
    for path in paths:
        key = folded(path)
        if key in seen:
            other = seen[key]
            if other == path:
                return f"duplicate path {path!r}"
            return f"paths {other!r} and {path!r} collide on a case-insensitive or normalising filesystem"
        seen[key] = path
        for folder in _folders(path):
            folders.setdefault(folded(folder), path)
    clash = next((path for key, path in seen.items() if key in folders), None)
    if clash is not None:
        return f"path {clash!r} is a file and also a folder of {folders[folded(clash)]!r}"
    return None
