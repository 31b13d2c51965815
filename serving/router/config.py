"""How one router process runs (``RouterConfig``), and the check that refuses one that cannot work.

Apart from the request path so that the command can build and check a configuration before any
listening code is involved, and so that the options read in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from revgate.manifests.errors import RevgateError
from revgate.registry.record_signing import RecordSigner
from revgate.registry.record_store import check_router_id, open_record_store
from revgate.serving.router.limits import MIB, Limits


@dataclass(frozen=True)
class RouterConfig:
    """How one router process runs."""

    route: str
    records: Path | None = None
    paired_records: Path | None = None
    records_sink: str | None = None  # a folder or s3://BUCKET/PREFIX: one object per router per interval
    router_id: str = "router"  # names this router's objects in the record store
    records_signer: RecordSigner | None = None  # signs each object (registry/record_signing.py); None: unsigned
    sink_interval_s: float = 1.0
    sink_capacity: int = 100_000  # records held per kind while the store cannot be written; then the oldest go
    admin_token: str | None = None
    poll_interval_s: float = 1.0
    record_outputs: bool = False
    shadow_queue: int = 256
    shadow_queue_bytes: int = 64 * MIB  # request bodies and stable answers held for the mirror, together
    shadow_concurrency: int = 4
    shadow_connect_timeout_s: float = 2.0
    limits: Limits = field(default_factory=Limits)  # the HTTP front's caps and timeouts, on the public and admin ports
    record_keep_bytes: int = 1024 * 1024  # of one answer, kept for its record (its two ends past this)


def check_config(config: RouterConfig) -> None:
    """Refuse a configuration that cannot work, before listening."""
    if config.poll_interval_s <= 0:
        raise RevgateError("poll interval must be positive", where="--poll-interval", fix="Give seconds, e.g. 1.0.")
    for name in fields(Limits):
        if getattr(config.limits, name.name) <= 0:
            flag = "--" + name.name.removesuffix("_s").replace("_", "-")
            raise RevgateError(f"{name.name} must be positive", where=flag, fix="See docs/router.md, limits.")
    if config.records_sink is not None:
        check_router_id(config.router_id)
        open_record_store(config.records_sink)
    if config.sink_interval_s <= 0 or config.sink_capacity <= 0:
        raise RevgateError("the record sink's interval and capacity must be positive", where="--sink-interval",
                           fix="Give seconds, e.g. 1.0, and a record count, e.g. 100000.")
    if config.record_keep_bytes < 2:
        raise RevgateError("the bytes kept per answer must be at least 2", where="--record-keep-bytes",
                           fix="Give bytes, e.g. 1048576.")
    if config.shadow_queue_bytes <= 0:
        raise RevgateError("the shadow queue's bytes must be positive", where="--shadow-queue-bytes",
                           fix="Give bytes, e.g. 67108864.")
