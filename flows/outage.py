"""A Prefect API that is away for a while: which errors say so, and a client that asks once per call.

Prefect's own client retries a refused connection for about a minute (5 attempts, doubling), then
raises. A rollout must outlast a longer outage: its leases are renewed by the heartbeat (which does
not need Prefect), and the parts that do need Prefect (the approval pause, ``revgate promote``'s live
view) wait it out here with their own deadline, asking every few seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.exceptions import PrefectHTTPStatusError
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings


def prefect_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the Prefect API is away (no answer, or a gateway's 5xx), not that a request was wrong."""
    if isinstance(error, httpx.TransportError):
        return True
    return isinstance(error, PrefectHTTPStatusError) and error.response.status_code in (500, 502, 503, 504)


@contextmanager
def asking_once() -> Iterator[SyncPrefectClient]:
    """A Prefect client whose calls fail at once when the API is away (the caller decides when to ask again)."""
    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}), get_client(sync_client=True) as client:
        yield client
