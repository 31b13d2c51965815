"""A worker agent restarted on its host: the replicas it left running are adopted, or stopped and named.

Real parts: the ``revgate worker`` command three times on one cache, a real vLLM replica of the zoo's
stable revision. With ``--keep-replicas`` a stopped agent leaves its ready replica's engine running
and the next agent with the flag takes it over with the same id and endpoint; an agent without the
flag stops what it finds, and the process table then holds none of the engine's processes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from revgate.flows import processes
from revgate.serving.worker.agent import AdoptedEngine
from revgate.serving.worker.client import WorkerClient
from revgate.serving.worker.engine import free_port, session_members
from revgate.serving.worker.kept import read_kept
from revgate.serving.worker.request import ReplicaRequest
from revgate.zoo.index import load_revisions
from tests.integration.test_worker_agent import START_TIMEOUT_S, completion, published_request, wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


@contextmanager
def agent(cache: Path, token: Path, port: int, *, keep: bool) -> Iterator[WorkerClient]:
    """``revgate worker`` on ``cache`` (with ``--keep-replicas`` if ``keep``), stopped by SIGTERM at the end."""
    argv = [sys.executable, "-m", "revgate.cli.main", "worker", "--port", str(port), "--cache", str(cache),
            "--token-file", str(token), "--startup-timeout", str(START_TIMEOUT_S), "--stop-timeout", "10",
            *(["--keep-replicas"] if keep else [])]
    with processes.service(argv, f"http://127.0.0.1:{port}/healthz", cache.parent / "worker.log") as process:
        client = WorkerClient(f"http://127.0.0.1:{port}", token.read_text().strip())
        client.process = process  # type: ignore[attr-defined]  # for a test that kills it
        yield client


def test_a_restarted_agent_adopts_the_replica_it_left_and_one_without_the_flag_stops_it(
    tmp_path: Path, zoo_dir: Path
) -> None:
    # The defect: restarting an agent took down every replica on its host, stable included, and nothing
    # adopted them again; an agent killed hard left vLLM's engine processes running for ever.
    request = published_request(tmp_path, zoo_dir / load_revisions(zoo_dir)["stable"].path)
    cache, token, port = tmp_path / "cache", processes.token_file(tmp_path / "token"), free_port()
    try:
        adopted_then_stopped(request, cache, token, port, tmp_path / "worker.log")
    finally:  # a kept engine outlives its agent by design: a test that fails midway still ends it
        for entry in read_kept(cache):
            AdoptedEngine(entry.engine_pid, entry.engine_port, tmp_path / "engine.log").stop(10)


def adopted_then_stopped(request: ReplicaRequest, cache: Path, token: Path, port: int, log: Path) -> None:
    with agent(cache, token, port, keep=True) as client:
        started = client.start(request)
        view = client.wait_for(str(started.replica_id), {"ready"}, START_TIMEOUT_S)
        assert view.state == "ready", view
    replica_id, endpoint, pid = str(view.replica_id), str(view.endpoint), int(view.pid)
    assert session_members(pid), "the kept replica's engine did not outlive its agent"

    with agent(cache, token, port, keep=True) as client:
        [adopted] = client.replicas()
        assert (adopted.replica_id, adopted.state, adopted.endpoint, adopted.pid, adopted.adopted) == (
            replica_id, "ready", endpoint, pid, True), adopted
        status, _, body = completion(endpoint, str(adopted.served_model), 4)
        assert status == 200, body[:300]
        assert client.capacity().revisions[str(adopted.revision)].ready_replicas == 1
        second = client.start(request.model_copy(update={"warm": request.warm}))
        assert second.replica_id != replica_id  # a new replica never takes an adopted id
        client.drain(str(second.replica_id), 1)
    assert f"replica {replica_id} ({adopted.served_model}) left by the last agent on this cache: adopted" \
        in log.read_text()
    assert session_members(pid), "the twice-kept engine did not outlive its second agent"

    with agent(cache, token, port, keep=False) as client:
        assert client.replicas() == []
        wait_until(lambda: not session_members(pid), 60, "the left engine's processes stopped")
    assert "left by the last agent on this cache: stopped: this agent does not keep replicas" in log.read_text()
    assert not session_members(pid)


def test_an_agent_killed_hard_leaves_nothing_the_next_agent_does_not_stop(tmp_path: Path, zoo_dir: Path) -> None:
    # SIGKILL gives the agent no shutdown: its engine's server dies with it (it is told when its parent
    # dies), and whatever of the engine's session is left the next agent on the cache finds and stops.
    request = published_request(tmp_path, zoo_dir / load_revisions(zoo_dir)["stable"].path)
    cache, token, port = tmp_path / "cache", processes.token_file(tmp_path / "token"), free_port()
    with agent(cache, token, port, keep=False) as client:
        started = client.start(request)
        view = client.wait_for(str(started.replica_id), {"ready"}, START_TIMEOUT_S)
        assert view.state == "ready", view
        client.process.kill()  # type: ignore[attr-defined]
        client.process.wait(30)  # type: ignore[attr-defined]
    pid = int(view.pid)
    with agent(cache, token, port, keep=False) as client:
        assert client.replicas() == []
        wait_until(lambda: not session_members(pid), 60, "nothing of the killed agent's engine running")
    said = (tmp_path / "worker.log").read_text()
    assert f"replica {view.replica_id} ({view.served_model}) left by the last agent on this cache: " in said
