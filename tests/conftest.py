"""Shared, expensive fixtures: one of each real server per test run."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from revgate.serving.worker.engine import free_port

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

# Every process this test run starts carries this mark in its environment (hosts' own environments
# too, tests/integration/hosts.py), so the process table can tell at the end what the run left behind.
RUN_MARK = "REVGATE_TEST_RUN"
LEFTOVER_WAIT_S = 30.0  # what a process stopped in the last teardown gets to go before it counts as left


def pytest_configure(config: pytest.Config) -> None:
    os.environ[RUN_MARK] = f"{os.getpid()}-{time.time_ns()}"  # this run's own, never a parallel run's


def marked_processes(mark: str) -> dict[int, str]:
    """Live processes (zombies aside) started with ``RUN_MARK=mark``: pid -> command line."""
    wanted = f"{RUN_MARK}={mark}".encode()
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        try:
            if pid == os.getpid() or wanted not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[pid] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # ended while we looked, or not ours to read
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No process outlives the run: after the last teardown, everything the run started must be gone (waited
    for up to LEFTOVER_WAIT_S). What is left is named, killed, and fails the run."""
    mark = os.environ.get(RUN_MARK, "")
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while (left := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} processes started by this run outlived it (killed now):",
             *(f"    {pid}: {command[:300]}" for pid, command in sorted(left.items()))]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for line in lines:
        reporter.write_line(line, red=True) if reporter is not None else print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A failure is printed the moment it happens (its last lines, with its time), not only in the summary at the
    end: a run cut off by its job's time limit still shows what failed, and why."""
    report: pytest.TestReport = yield
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    if report.failed and reporter is not None:
        reporter.write_line("")
        reporter.write_line(f"FAILED {report.nodeid} ({report.when}, after {report.duration:.0f} s):", red=True)
        for line in str(report.longrepr).splitlines()[-40:]:
            reporter.write_line(f"    {line}")
    return report


def wait_for_port(port: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Block until something accepts connections on ``port``, or fail with the reason."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout} s")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 wire-protocol server (moto's server mode) on 127.0.0.1, for the whole run."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, 30, process)
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Prefect server for the run; this process's Prefect settings point at it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from revgate.flows.processes import prefect_server

    with (
        prefect_server(tmp_path_factory.mktemp("prefect")) as env,
        temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}),
    ):
        yield env["PREFECT_API_URL"]


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The deployment's hosts, each a network namespace of its own (tests/integration/hosts.py), for the run.

    Leftovers of an earlier run killed hard are deleted first; at the end every process still on a
    host is ended and the namespaces go. Skipped, saying what is missing, where namespaces cannot be made.
    """
    from tests.integration.hosts import HOST_NAMES, HostsUnavailable, Network, run_prefix, sweep_stale, why_unavailable

    missing = why_unavailable()
    if missing:
        pytest.skip(f"no hosts of their own: {missing}")
    try:
        sweep_stale(run_prefix())
        network = Network.create(run_prefix(), HOST_NAMES, tmp_path_factory.mktemp("hosts"))
    except HostsUnavailable as missing:
        pytest.skip(f"no hosts of their own: {missing}")
    try:
        yield network
    finally:
        network.close()


# --- the reference model zoo (zoo engineer) ---
ZOO_EVAL_PER_SLICE = 300


@pytest.fixture(scope="session")
def zoo_dir() -> Path:
    """The reference zoo under .cache/zoo, built once and reused while its recipe and code are unchanged."""
    from revgate.zoo.build import make_zoo
    from revgate.zoo.recipe import default_zoo

    make_zoo(CACHE / "zoo", default_zoo())
    return CACHE / "zoo"


@pytest.fixture(scope="session")
def zoo_eval(zoo_dir: Path) -> dict[str, Any]:
    """Every zoo revision served by vLLM and measured (ZOO/eval/*.jsonl), reused while the zoo is unchanged."""
    from revgate.zoo.evaluate import evaluated_zoo

    return dict(evaluated_zoo(zoo_dir, ZOO_EVAL_PER_SLICE))


@pytest.fixture(scope="session")
def vllm_stable(zoo_dir: Path) -> Iterator[Any]:
    """One vLLM server for the whole run: stable, with LoRA on and the adapter loaded as ``adapter``."""
    from revgate.serving.worker.engine import LoraModule, serve
    from revgate.zoo.evaluate import ZOO_EXECUTION
    from revgate.zoo.index import load_revisions

    revisions = load_revisions(zoo_dir)
    adapter = LoraModule("adapter", zoo_dir / revisions["adapter"].path)
    with serve(zoo_dir / revisions["stable"].path, ZOO_EXECUTION, "stable", lora_modules=[adapter]) as engine:
        engine.wait_healthy()
        yield engine


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    """A gate policy file: slices by family, 300 samples per stage, a 5-point margin, one TTFT SLO."""
    from revgate.manifests.gates import GatePolicy

    policy = GatePolicy.build(
        slice_keys=["family"],
        max_samples_per_stage=300,
        look_every=50,
        quality_margin="0.05",
        slo=[{"ttft_ms": 200, "attainment": "0.9"}],
    )
    path = tmp_path / "policy.json"
    path.write_bytes(policy.canonical())
    return path
