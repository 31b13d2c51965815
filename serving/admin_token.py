"""The router's admin token: read from a file only its owner can read, offered as ``Bearer <token>``.

The same rule as the worker's control token (``serving/worker/auth.py``); kept beside both parts
of the data plane because the router and the worker do not import each other.
"""

from __future__ import annotations

import hmac
import stat
from pathlib import Path

from manifests.errors import RevgateError

MIN_TOKEN_CHARS = 16


class AdminTokenInvalid(RevgateError):
    """The admin token file is missing, empty, too short, or readable by other users."""


def load_admin_token(path: Path) -> str:
    """The token (surrounding whitespace ignored); refuse a weak token or one others can read."""
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise AdminTokenInvalid(
            f"cannot read the admin token file ({error})", where=str(path), fix="Pass an existing --admin-token-file."
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AdminTokenInvalid(
            "the admin token file is readable by other users", where=str(path), fix=f"Run: chmod 600 {path}"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise AdminTokenInvalid(
            f"the admin token is shorter than {MIN_TOKEN_CHARS} characters",
            where=str(path),
            fix="Write a random token, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`.",
        )
    return token


def authorized(header: bytes | None, token: str) -> bool:
    """True only for exactly ``Authorization: Bearer <token>``; compared in constant time."""
    if header is None or not header.startswith(b"Bearer "):
        return False
    return hmac.compare_digest(header[7:], token.encode("utf-8"))
