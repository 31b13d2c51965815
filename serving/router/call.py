"""One caller request as the router serves it: everything decided at entry, and what its attempts changed.

Its own module so that the request path (service.py) and the parts that read a finished call (the
records in evidence.py, the shadow copy in shadow_dispatch.py) share one definition without
importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from revgate.serving.router.deadlines import Slot
from revgate.serving.router.http import Request, ServerConnection
from revgate.serving.router.relay import Relay
from revgate.serving.router.split import PinnedRoute, Target
from revgate.serving.router.upstream import UpstreamConnection


@dataclass(slots=True)
class Call:
    """One caller request, pinned: everything decided at entry."""

    caller: ServerConnection
    request: Request
    route: PinnedRoute
    target: Target
    path: bytes
    body: bytes
    request_id: str  # the router's
    caller_request_id: str  # the caller's x-request-id, kept as given (evidence, never a key)
    tenant: str
    slices: dict[str, str]
    arrival_s: float
    headers: bytes
    labels: tuple[tuple[str, str], ...]  # the in-flight gauge's
    attempts: int = 0
    endpoint: str = ""
    expired: bool = False
    relay: Relay | None = field(default=None)
    deadline: float = 0.0  # loop time
    deadline_slot: Slot | None = None  # where the call waits for its deadline
    connection: UpstreamConnection | None = None
    first: int = 0  # the first endpoint tried
    document: Any = None  # the request body's JSON, parsed once at entry (UNREADABLE if it is not JSON)
    callers_deadline: bool = False  # the deadline is the caller's own shorter one, not the route's
    revealed: bool = False  # the answer names the revision and arm (a credentialed caller, or the route says so)
    stripped: bool = False  # evidence metadata was dropped from the parsed body: it is written again
    fallback_from: str = ""  # the candidate assigned, when none of its replicas took it and stable serves
