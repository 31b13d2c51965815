"""The router's admin token: the data plane's token-file rule (``serving/token_file.py``)."""

from __future__ import annotations

from pathlib import Path

from revgate.serving.token_file import TokenFileInvalid, bearer_matches, load_token

authorized = bearer_matches


class AdminTokenInvalid(TokenFileInvalid):
    """The admin token file is missing, empty, too short, or readable by other users."""


def load_admin_token(path: Path) -> str:
    """The admin token; refuse a weak token or one others can read."""
    return load_token(path, what="admin token", flag="--admin-token-file", error=AdminTokenInvalid)
