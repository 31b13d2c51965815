"""Ready replicas an agent leaves running across its own restart, and what the next agent reads of them.

An agent started with ``keep_replicas`` records each ready replica in ``CACHE/replicas.json`` (written
whole, then renamed) and, when it stops, leaves their engines running: a restart of the agent (an
upgrade, a crash) then costs the host no replica, stable included. The next agent on the cache reads
the file first: a replica whose engine still runs and answers is adopted (same id, same endpoint)
when that agent keeps replicas too, and stopped otherwise; either way the agent says which.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from revgate.serving.worker.request import ReplicaRequest
from revgate.serving.worker.state import Capacity

LOG = logging.getLogger("revgate.worker")
KEPT_FILE = "replicas.json"


@dataclass(frozen=True)
class KeptReplica:
    """What an agent needs to take a running replica over: who it is, its engine, its proxy's port."""

    replica_id: str
    revision: str
    served_model: str
    request: dict[str, Any]  # the ReplicaRequest it was started with, as JSON
    engine_pid: int  # the engine's session leader: stopping its process group stops every engine process
    engine_port: int
    proxy_port: int
    cpu_cores: tuple[int, ...]
    slot: int | None
    capacity: dict[str, float] | None
    created_at: float
    timings_s: dict[str, float]

    def replica_request(self) -> ReplicaRequest:
        """The start request, typed again."""
        return ReplicaRequest.model_validate_json(json.dumps(self.request))  # strict: JSON in, as on the wire

    def measured(self) -> Capacity | None:
        """The capacity its warm-up measured."""
        return None if self.capacity is None else Capacity(**self.capacity)  # type: ignore[arg-type]


def read_kept(cache: Path) -> list[KeptReplica]:
    """The replicas the last agent on ``cache`` recorded; a file that cannot be read is named and ignored."""
    path = cache / KEPT_FILE
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        return [KeptReplica(**{**entry, "cpu_cores": tuple(entry["cpu_cores"])}) for entry in entries]
    except (OSError, ValueError, TypeError, KeyError) as error:
        LOG.warning("ignoring %s: it is not a list of kept replicas (%s); engines it named are not adopted",
                    path, error)
        return []


def write_kept(cache: Path, kept: list[KeptReplica]) -> None:
    """Record ``kept`` whole: written beside, then renamed over, so a reader never sees half a file."""
    path = cache / KEPT_FILE
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps([asdict(entry) for entry in kept], indent=1), encoding="utf-8")
    os.replace(partial, path)
