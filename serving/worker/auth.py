"""Authentication of the worker's control API: a shared bearer token read from a file."""

from __future__ import annotations

from revgate.serving.token_file import TokenFileInvalid, bearer_matches, load_token, write_token

__all__ = ["TokenFileInvalid", "authorized", "load_token", "write_token"]


def authorized(header_value: str | None, token: str) -> bool:
    """True only for ``Authorization: Bearer <token>``; compared in constant time."""
    if header_value is None:
        return False
    return bearer_matches(header_value.strip().encode("utf-8"), token)
