"""A lost or corrupt route history entry never blocks `revgate rollback`, in either route store."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from revgate.registry.route_store import open_route_store
from tests.integration.commands import revgate
from tests.integration.test_rollback_cli import STABLE, seed_history

pytestmark = pytest.mark.servers



def _file_store(tmp_path: Path) -> tuple[str, Callable[[str, bytes | None], None]]:
    root = tmp_path / "routes"

    def damage(name: str, data: bytes | None) -> None:
        path = root / "chat" / name
        path.unlink()
        if data is not None:
            path.write_bytes(data)

    return str(root), damage


def _s3_store(endpoint: str) -> tuple[str, Callable[[str, bytes | None], None]]:
    bucket = f"routes-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)

    def damage(name: str, data: bytes | None) -> None:
        key = f"prod/chat/{name}"
        if data is None:
            client.delete_object(Bucket=bucket, Key=key)
        else:
            client.put_object(Bucket=bucket, Key=key, Body=data)

    return f"s3://{bucket}/prod?endpoint_url={endpoint}", damage


NEWEST = "history/000000000003.json"
OLDEST = "history/000000000001.json"
DAMAGES = {
    "newest history entry lost": (NEWEST, None),
    "newest history entry corrupt": (NEWEST, b'{"kind": "RouteSnap'),
    "oldest history entry corrupt": (OLDEST, b"\x00\x00\x00"),
    "current corrupt": ("current.json", b"{}"),
    "newest history entry not canonical": (NEWEST, b' {"route": "chat"} '),
}


@pytest.mark.parametrize("backend", ["file", "s3"])
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_rollback_plans_around_a_damaged_entry(backend: str, damage: str, tmp_path: Path,
                                               request: pytest.FixtureRequest) -> None:
    url, harm = _file_store(tmp_path) if backend == "file" else _s3_store(request.getfixturevalue("s3_endpoint"))
    seed_history(url)  # generation 1 stable, 2 canary, 3 the canary promoted
    harm(*DAMAGES[damage])

    done = revgate("rollback", "--routes", url, "--route", "chat", "--created-by", "oncall", "--force")
    assert done.returncode == 0, done.stderr
    assert "generation 3 -> 4" in done.stdout
    store = open_route_store(url)
    current = store.read("chat")
    assert current is not None and current.generation == 4 and current.stable.fingerprint == STABLE.fingerprint
    generations = [snapshot.generation for snapshot in store.history("chat")]
    assert generations[-2:] == [3, 4]  # the write repaired the newest entry it found damaged
