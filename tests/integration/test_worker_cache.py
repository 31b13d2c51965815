"""One live worker agent per cache folder, through real ``revgate worker`` processes."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from revgate.serving.worker.auth import write_token
from revgate.serving.worker.engine import free_port
from tests.conftest import ROOT, wait_for_port

pytestmark = pytest.mark.servers

TOKEN = "a-worker-token-for-the-cache-test"


def agent(cache: Path, token_file: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "revgate.cli.main", "worker", "--host", "127.0.0.1", "--port", str(port),
             "--cache", str(cache), "--token-file", str(token_file)],
            cwd=ROOT, stdout=output, stderr=subprocess.STDOUT,
        )


def test_a_second_agent_on_a_live_agents_cache_is_refused_and_removes_nothing(tmp_path: Path) -> None:
    # The defect: a second agent on the same cache removed the first one's replica folders at its
    # start; the next load on the first agent then failed with vLLM's "Repo id must be in the form".
    token_file = tmp_path / "token"
    write_token(token_file, TOKEN)
    cache = tmp_path / "cache"
    first_port = free_port()
    first = agent(cache, token_file, first_port, tmp_path / "first.log")
    try:
        wait_for_port(first_port, 60, first)
        live = cache / "replicas" / "r-1"
        live.mkdir(parents=True)
        (live / "config.json").write_text("{}")  # stands for a live replica's folder
        second_port = free_port()
        second = agent(cache, token_file, second_port, tmp_path / "second.log")
        try:
            assert second.wait(60) != 0
        finally:
            if second.poll() is None:  # the defect: it ran on; it must not outlive the test either way
                second.kill()
                second.wait(10)
        said = (tmp_path / "second.log").read_text()
        assert f"another worker agent (pid {first.pid}) holds the cache folder {cache}" in said
        assert "--cache" in said  # what to do
        assert (live / "config.json").exists(), "the refused agent removed a live agent's replica folder"
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)
    # Once the first agent has gone, the folder is free again (the kernel released the lock).
    third_port = free_port()
    third = agent(cache, token_file, third_port, tmp_path / "third.log")
    try:
        wait_for_port(third_port, 60, third)
    finally:
        third.send_signal(signal.SIGTERM)
        third.wait(30)
