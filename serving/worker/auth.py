"""Authentication of the worker's control API: a shared bearer token read from a file."""

from __future__ import annotations

import hmac
import os
import stat
from pathlib import Path

from manifests.errors import RevgateError

MIN_TOKEN_CHARS = 16


class TokenFileInvalid(RevgateError):
    """The token file is missing, empty, too short, or readable by other users."""


def load_token(path: Path) -> str:
    """Read the control token (surrounding whitespace ignored); refuse weak or exposed tokens."""
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise TokenFileInvalid(
            f"cannot read the token file ({error.strerror})", where=str(path), fix="Pass an existing --token-file."
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenFileInvalid(
            "the token file is readable by other users", where=str(path), fix=f"Run: chmod 600 {path}"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenFileInvalid(
            f"the token is shorter than {MIN_TOKEN_CHARS} characters",
            where=str(path),
            fix="Write a random token, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`.",
        )
    return token


def write_token(path: Path, token: str) -> None:
    """Write a token file only its owner can read (created with mode 600, never widened)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")


def authorized(header_value: str | None, token: str) -> bool:
    """True only for ``Authorization: Bearer <token>``; compared in constant time."""
    if header_value is None or not header_value.startswith("Bearer "):
        return False
    offered = header_value.removeprefix("Bearer ").strip().encode("utf-8")
    return hmac.compare_digest(offered, token.encode("utf-8"))
