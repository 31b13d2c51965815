"""`revgate rollback` through the real route stores, with no Prefect and no MLflow involved."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import boto3
import pytest

from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import canary, successor
from revgate.registry.route_store import open_route_store
from revgate.serving.worker.engine import free_port
from tests.integration.commands import revgate
from tests.integration.s3_proxy import serving

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
STABLE = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:8001",))
CANDIDATE = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:8002",))


def seed_history(url: str) -> list[RouteSnapshot]:
    store = open_route_store(url)
    first = RouteSnapshot.build(route="chat", generation=1, stable=STABLE, created_by="seed", created_at=NOW)
    with_canary = successor(first, by="flow", now=NOW, candidate=canary(CANDIDATE, 50_000, NOW, 600))
    promoted = successor(with_canary, by="flow", now=NOW, stable=CANDIDATE, candidate=None)
    for snapshot in (first, with_canary, promoted):
        store.write(snapshot)
    return [first, with_canary, promoted]


@pytest.fixture
def file_store(tmp_path: Path) -> str:
    return str(tmp_path / "routes")


@pytest.fixture
def s3_store(s3_endpoint: str) -> str:
    bucket = f"routes-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/prod?endpoint_url={s3_endpoint}"


@pytest.mark.servers
@pytest.mark.parametrize("store_fixture", ["file_store", "s3_store"])
def test_rollback_reverts_the_last_promotion_atomically(store_fixture: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(store_fixture)
    seed_history(url)
    dry = revgate("rollback", "--routes", url, "--route", "chat", "--dry-run", "--created-by", "oncall", "--force")
    assert dry.returncode == 0, dry.stderr
    assert "nothing committed" in dry.stdout
    assert open_route_store(url).read("chat").generation == 3  # type: ignore[union-attr]

    done = revgate("rollback", "--routes", url, "--route", "chat", "--created-by", "oncall", "--force")
    assert done.returncode == 0, done.stderr
    current = open_route_store(url).read("chat")
    assert current is not None and current.generation == 4
    assert current.stable.fingerprint == STABLE.fingerprint and current.created_by == "oncall"
    assert [snap.generation for snap in open_route_store(url).history("chat")] == [1, 2, 3, 4]


@pytest.mark.servers
def test_rollback_of_a_route_that_never_changed_fails_and_commits_nothing(file_store: str) -> None:
    store = open_route_store(file_store)
    store.write(RouteSnapshot.build(route="chat", generation=1, stable=STABLE, created_by="seed", created_at=NOW))
    result = revgate("rollback", "--routes", file_store, "--route", "chat")
    assert result.returncode == 2
    assert "NothingToRollBack" in result.stderr and "only ever served one revision" in result.stderr
    assert [snap.generation for snap in store.history("chat")] == [1]


def admin_generation(admin_url: str, token: str) -> int:
    """The generation a running router serves, from its admin port."""
    import json
    import urllib.request

    request = urllib.request.Request(  # noqa: S310 - local admin port
        f"{admin_url}/admin/snapshot", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - local admin port
        return int(json.loads(response.read())["generation"])


@pytest.mark.servers
def test_rollback_tells_the_routers_it_knows_and_the_others_poll_it_in(file_store: str, tmp_path: Path) -> None:
    import sys
    import time

    from revgate.flows.processes import service, token_file
    from revgate.serving.worker.engine import free_port

    seed_history(file_store)
    token = token_file(tmp_path / "token")
    routers = []
    with ExitStack() as running:
        for name, poll_s in (("told", "60"), ("polling", "0.5")):  # the told one would not poll for a minute
            port, admin = free_port(), free_port()
            argv = [sys.executable, "-m", "revgate.cli.main", "router", "--routes", file_store, "--route", "chat",
                    "--port", str(port), "--admin-port", str(admin), "--admin-token-file", str(token),
                    "--poll-interval", poll_s]
            running.enter_context(service(argv, f"http://127.0.0.1:{port}/health", tmp_path / f"{name}.log"))
            routers.append(f"http://127.0.0.1:{admin}")
        told, polling = routers
        secret = token.read_text().strip()
        assert admin_generation(told, secret) == 3 and admin_generation(polling, secret) == 3

        unreachable = f"http://127.0.0.1:{free_port()}"
        done = revgate("rollback", "--routes", file_store, "--route", "chat", "--created-by", "oncall", "--force",
                       "--notify", told, "--notify", unreachable, "--admin-token-file", str(token))
        assert done.returncode == 0, done.stderr  # a router that cannot be told does not undo the rollback
        assert f"router {told}: serving generation 4" in done.stdout
        assert f"router {unreachable}: not told" in done.stdout and "next poll" in done.stdout
        assert admin_generation(told, secret) == 4  # at once, long before its next poll
        deadline = time.monotonic() + 30
        while admin_generation(polling, secret) != 4:  # the router nobody told reads it from the store
            assert time.monotonic() < deadline, "the polling router never picked the rollback up"
            time.sleep(0.2)


def test_an_unreadable_admin_token_file_is_refused_before_the_rollback_commits(file_store: str, tmp_path: Path) -> None:
    seed_history(file_store)
    missing = tmp_path / "nowhere.token"
    done = revgate("rollback", "--routes", file_store, "--route", "chat", "--force",
                   "--notify", f"http://127.0.0.1:{free_port()}", "--admin-token-file", str(missing))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cannot read the admin token file" in done.stderr and str(missing) in done.stderr
    assert open_route_store(file_store).read("chat").generation == 3  # type: ignore[union-attr]
    # Without a token file the rollback lands and says which routers it could not tell.
    router = f"http://127.0.0.1:{free_port()}"
    done = revgate("rollback", "--routes", file_store, "--route", "chat", "--force", "--notify", router)
    assert done.returncode == 0, done.stderr
    assert f"router {router}: not told (no --admin-token-file given)" in done.stdout
    assert open_route_store(file_store).read("chat").generation == 4  # type: ignore[union-attr]


def test_gc_with_an_unreadable_token_file_names_it_and_drains_nothing(file_store: str, tmp_path: Path) -> None:
    seed_history(file_store)
    missing = tmp_path / "workers.token"
    done = revgate("gc", "--routes", file_store, "--worker", f"http://127.0.0.1:{free_port()}",
                   "--token-file", str(missing))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cannot read the workers' token file" in done.stderr and str(missing) in done.stderr


def test_rollback_needs_neither_prefect_nor_mlflow(file_store: str) -> None:
    import subprocess
    import sys

    seed_history(file_store)
    program = ("import sys; from cli.main import main; code = main(sys.argv[1:]); "
               "loaded = [m for m in ('prefect', 'mlflow') if m in sys.modules]; "
               "print('loaded:', loaded); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", program, "rollback", "--routes", file_store, "--route", "chat",
                           "--created-by", "oncall", "--force"], capture_output=True, text=True, check=False,
                          env={"PATH": "", "PREFECT_API_URL": "http://127.0.0.1:9/api",
                               "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout
    assert open_route_store(file_store).read("chat").generation == 4  # type: ignore[union-attr]


@contextmanager
def healthy_endpoint() -> Iterator[str]:
    """A real HTTP server answering GET /health with 200, as a replica proxy does; its base URL."""
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Health) as url:
        yield url


def promoted_history(url: str, old_endpoints: tuple[str, ...]) -> None:
    """Generation 1 an old stable on ``old_endpoints``, 2 its canary, 3 the candidate promoted."""
    old = RevisionTarget(fingerprint=STABLE.fingerprint, endpoints=old_endpoints)
    store = open_route_store(url)
    first = RouteSnapshot.build(route="chat", generation=1, stable=old, created_by="seed", created_at=NOW)
    with_canary = successor(first, by="flow", now=NOW, candidate=canary(CANDIDATE, 50_000, NOW, 600))
    for snapshot in (first, with_canary, successor(with_canary, by="flow", now=NOW, stable=CANDIDATE, candidate=None)):
        store.write(snapshot)


@pytest.mark.servers
def test_a_rollback_onto_a_drained_stable_is_refused_and_changes_nothing(file_store: str) -> None:
    # The defect: after the window the old stable is drained; `revgate rollback` wrote a snapshot
    # whose stable endpoints were dead, without checking any replica: every request to nothing.
    dead = (f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")
    promoted_history(file_store, dead)
    refused = revgate("rollback", "--routes", file_store, "--route", "chat", "--created-by", "oncall")
    assert refused.returncode == 2
    assert "NoLiveStable" in refused.stderr and "would land on nothing" in refused.stderr
    assert "Start replicas of that revision first" in refused.stderr
    assert open_route_store(file_store).read("chat").generation == 3  # type: ignore[union-attr]


@pytest.mark.servers
def test_a_rollback_lands_only_on_the_endpoints_that_answer(file_store: str) -> None:
    with healthy_endpoint() as live:
        dead = f"http://127.0.0.1:{free_port()}"
        promoted_history(file_store, (dead, live))
        done = revgate("rollback", "--routes", file_store, "--route", "chat", "--created-by", "oncall")
    assert done.returncode == 0, done.stderr
    assert f"endpoint {dead} does not answer its health check: left out" in done.stdout
    current = open_route_store(file_store).read("chat")
    assert current is not None and current.stable.fingerprint == STABLE.fingerprint
    assert current.stable.endpoints == (live,)


@pytest.mark.servers
def test_a_rollback_that_loses_races_to_a_heartbeat_plans_again_and_lands(
    file_store: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The defect: the rollback planned once and never retried a conflict, while a live rollout's
    # heartbeat adds a generation per renewal: with short renewals it lost the race every time.
    # Here the real heartbeat write lands between the rollback's read and its write, twice.
    from revgate.cli.main import main
    from revgate.registry import route_store

    real = open_route_store(file_store)
    first = RouteSnapshot.build(route="chat", generation=1, stable=STABLE, created_by="seed", created_at=NOW)
    real.write(first)
    real.write(successor(first, by="flow", now=NOW, candidate=canary(CANDIDATE, 50_000, NOW, 600)))
    races = [2, 1]

    class RenewedMeanwhile:
        """The real store; after each of the rollback's first two reads, the heartbeat renews."""

        def __init__(self, store: Any) -> None:
            self.store = store

        def renew(self, newest: RouteSnapshot) -> None:
            if races:
                races.pop()
                now = datetime.now(UTC)
                self.store.write(successor(newest, by="flow", now=now, candidate=canary(CANDIDATE, 50_000, now, 600)))

        def back(self, route: str) -> Iterator[RouteSnapshot]:
            generations = self.store.back(route)
            newest = next(generations)
            self.renew(newest)
            yield newest
            yield from generations

        def history(self, route: str) -> list[RouteSnapshot]:  # the same race for a planner that reads it all
            found = self.store.history(route)
            self.renew(found[-1])
            return list(found)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.store, name)

    monkeypatch.setattr(route_store, "open_route_store", lambda url: RenewedMeanwhile(real))
    assert main(["rollback", "--routes", file_store, "--route", "chat", "--created-by", "oncall"]) == 0
    assert races == [] and capsys.readouterr().out.count("planning again") == 2
    current = real.read("chat")
    assert current is not None and current.generation == 5 and current.candidate is None
    assert current.created_by == "oncall"
