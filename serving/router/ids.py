"""Request ids: the router's own for every request; the caller's id headers only read, checked, kept."""

from __future__ import annotations

import json
import os

MAX_ID_BYTES = 256  # a caller's x-request-id or x-tenant-id


class RequestIds:
    """Request ids the router makes: 96 bits from the OS's random source, read 4 KiB at a time.

    Unpredictable and unique, so no caller can choose or collide with another request's id (the
    records and the shadow sample are keyed by it), without a getrandom() call per request.
    """

    __slots__ = ("offset", "pool")

    def __init__(self) -> None:
        self.pool, self.offset = b"", 0

    def next(self) -> bytes:
        """A new id: 24 hex digits."""
        offset = self.offset
        if offset + 12 > len(self.pool):
            self.pool, offset = os.urandom(4092), 0
        self.offset = offset + 12
        return self.pool[offset:offset + 12].hex().encode()


def caller_text(value: bytes) -> str | None:
    """A caller's id header as text; None when it is not UTF-8 or too long to be an id."""
    if len(value) > MAX_ID_BYTES:
        return None
    if value.isascii():
        return value.decode("ascii")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def bad_id(name: str) -> bytes:
    """The 400 answer's body for an unreadable id header."""
    return json.dumps({"error": {
        "message": f"{name} is not UTF-8 text of at most {MAX_ID_BYTES} bytes", "type": "invalid_request_error",
        "where": f"header {name}", "fix": f"Send {name} as short UTF-8 text, or leave it out.",
    }}).encode()
