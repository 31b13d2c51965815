"""Shared-secret token files of the data plane: readable by their owner only, offered as ``Bearer <token>``.

The worker's control token and the router's admin token follow one rule; it lives here, beside both
parts, because the router and the worker do not import each other.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

from revgate.manifests.errors import RevgateError

MIN_TOKEN_CHARS = 16


class TokenFileInvalid(RevgateError):
    """The token file is missing, empty, too short, or readable by other users."""


def load_token(
    path: Path, *, what: str = "token", flag: str = "--token-file", error: type[TokenFileInvalid] = TokenFileInvalid
) -> str:
    """The token (surrounding whitespace ignored); refuse a weak token or one others can read."""
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as failure:
        raise error(
            f"cannot read the {what} file ({failure})", where=str(path), fix=f"Pass an existing {flag}."
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise error(f"the {what} file is readable by other users", where=str(path), fix=f"Run: chmod 600 {path}")
    if len(token) < MIN_TOKEN_CHARS:
        raise error(
            f"the {what} is shorter than {MIN_TOKEN_CHARS} characters",
            where=str(path),
            fix="Write a random token, e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`.",
        )
    return token


def credential_digest(path: Path, *, flag: str = "--credential-file") -> str:
    """``sha256:<hex>`` of a credential file's credential, as a route names it: never the credential itself."""
    token = load_token(path, what="credential", flag=flag)
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def write_token(path: Path, token: str) -> None:
    """Write a token file only its owner can read (created with mode 600, never widened)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")


def bearer_matches(header: bytes | None, token: str) -> bool:
    """True only for exactly ``Bearer <token>``; compared in constant time."""
    if header is None or not header.startswith(b"Bearer "):
        return False
    return hmac.compare_digest(header[7:], token.encode("utf-8"))
