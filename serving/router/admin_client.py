"""The controller's side of a router's admin port, through the seam: each answer a document.

Used by the flow, the rollback and route commands and ``revgate status``; never by the router itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from revgate.manifests.seam import ReplyDocument, Seam, Transport, network


class OutletHealth(ReplyDocument):
    """One record outlet's state: a JSON-lines file (``files``), or the base of a record store's sink."""

    ok: bool
    where: str
    written_records: int = 0
    failures: int = 0
    dropped: int = 0
    held: int = 0
    capacity: int = 0
    last_error: str = ""
    failing_since_s: float | None = None


class SinkHealth(OutletHealth):
    """The record store's sink for one kind of record (``sinks``): objects written, and whether it signs them."""

    signed: bool = False
    written_objects: int = 0
    last_success_s: float | None = None


class RouterHealth(ReplyDocument):
    """``GET /admin/health``: the generation served, each record sink's state, and a store gone backwards."""

    status: str
    route: str
    generation: int
    router_id: str = ""
    sinks: dict[str, SinkHealth] = Field(default_factory=dict)
    files: dict[str, OutletHealth] = Field(default_factory=dict)
    store_regressed: dict[str, Any] | None = None


class Refreshed(ReplyDocument):
    """``POST /admin/notify`` and ``/admin/accept-store-epoch``: what the re-read did, and the generation now."""

    result: str
    generation: int


class RouterAdmin:
    """One router's admin port at ``admin_url``, with its bearer token."""

    def __init__(self, admin_url: str, token: str, *, timeout_s: float = 10.0, transport: Transport = network) -> None:
        self.url = admin_url.rstrip("/")
        self.seam = Seam(self.url, service="router", token=token, timeout_s=timeout_s, transport=transport)

    @classmethod
    def from_token_file(cls, admin_url: str, token_file: str | Path, *, timeout_s: float = 10.0) -> RouterAdmin:
        """With the token kept in ``token_file`` (read now: a rotated token is picked up by the next client)."""
        return cls(admin_url, Path(token_file).read_text(encoding="utf-8").strip(), timeout_s=timeout_s)

    def health(self) -> RouterHealth:
        """What the router serves, and how its record sinks are."""
        return self.seam.call("GET", "/admin/health", RouterHealth)

    def notify(self) -> Refreshed:
        """Re-read the route now."""
        return self.seam.call("POST", "/admin/notify", Refreshed, b"")

    def accept_store_epoch(self) -> Refreshed:
        """Take the store's current generation as a new epoch (after the store went backwards)."""
        return self.seam.call("POST", "/admin/accept-store-epoch", Refreshed, b"")
