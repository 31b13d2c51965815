"""The wheel as each host installs it: one import name, and each host's part from its own extra.

The wheel is built from this checkout with ``python -m build`` and installed into fresh
environments, one per host kind: the bare install, ``[router]`` (an edge host), ``[worker]`` (a GPU
host) and ``[control]`` (the Prefect worker). A router and a worker agent then run from the light
environments, which hold no Prefect, MLflow or PyTorch, in front of a real vLLM replica (the engine
keeps its environment of its own); each command run from a host without its extra names the pip
command that adds it. The environments are built once for the module, in parallel.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from revgate.flows.processes import stop
from revgate.manifests.route import RouteSnapshot
from revgate.serving.worker.auth import write_token
from revgate.serving.worker.client import WorkerClient
from revgate.serving.worker.engine import engine_python, free_port
from revgate.zoo.index import load_revisions
from tests import package_view
from tests.conftest import wait_for_port
from tests.integration.router_harness import router_process
from tests.integration.test_worker_agent import (
    START_TIMEOUT_S,
    completion,
    pid_alive,
    published_request,
    wait_until,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]
HOSTS = {"bare": "", "router": "[router]", "worker": "[worker]", "control": "[control]"}
CONTROL_PLANE = ("prefect", "mlflow", "scipy", "torch", "transformers")
TOKEN = "packaging-test-token-0123456789abcdef"
INSTALL_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build --wheel`` of this checkout as it is (with this environment's setuptools)."""
    return package_view.build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def hosts(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fresh environment per host kind, each with the wheel and its extra only: kind -> environment."""
    root = tmp_path_factory.mktemp("hosts")

    def install(kind: str) -> Path:
        env = root / kind
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=120)
        done = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet",
                               "--disable-pip-version-check", f"{wheel}{HOSTS[kind]}"],
                              capture_output=True, text=True, check=False, timeout=INSTALL_TIMEOUT_S)
        assert done.returncode == 0, f"{kind}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        return env

    with ThreadPoolExecutor(len(HOSTS)) as pool:
        return dict(zip(HOSTS, pool.map(install, HOSTS), strict=True))


def python_in(env: Path, code: str) -> str:
    """Run ``code`` with the environment's interpreter from a folder outside the checkout; its output."""
    done = subprocess.run([str(env / "bin" / "python"), "-c", code], cwd=env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def importable(env: Path, modules: tuple[str, ...]) -> list[str]:
    code = ("import importlib.util, json; "
            f"print(json.dumps([m for m in {list(modules)!r} if importlib.util.find_spec(m)]))")
    return json.loads(python_in(env, code))  # type: ignore[no-any-return]


def revgate_in(env: Path, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The environment's own ``revgate`` console script, run from outside the checkout."""
    return subprocess.run([str(env / "bin" / "revgate"), *args], cwd=env, capture_output=True, text=True,
                          check=False, timeout=240, env={**os.environ, **(extra_env or {})})


def test_the_wheel_and_every_install_add_one_import_name(wheel: Path, hosts: dict[str, Path]) -> None:
    listed = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True,
                            check=True).stdout.splitlines()[1:]
    tops = {line.split()[0].split("/")[0] for line in listed if line.strip()}
    assert tops == {"revgate", "revgate-0.1.0.dist-info"}, tops
    assert any(line.split()[0] == "revgate/flows/prefect.yaml" for line in listed if line.strip())  # the deployments
    names = ("import importlib.metadata as m; "
             "print(sorted({f.parts[0] for f in m.files('revgate') if f.suffix == '.py'}))")
    for kind, env in hosts.items():
        assert python_in(env, names).strip() == "['revgate']", kind
        # The folders of the repository are subpackages; none is a top-level name of its own.
        assert importable(env, ("revgate.flows", "flows", "registry", "cli", "serving")) == ["revgate.flows"], kind


def test_the_light_hosts_carry_no_control_plane_and_the_control_host_no_zoo(hosts: dict[str, Path]) -> None:
    for kind in ("bare", "router", "worker"):
        assert importable(hosts[kind], CONTROL_PLANE) == [], kind
    assert importable(hosts["bare"], ("httptools", "uvicorn", "model_signing", "boto3")) == ["boto3"]
    assert importable(hosts["router"], ("httptools", "uvloop", "uvicorn", "model_signing")) == ["httptools", "uvloop"]
    assert importable(hosts["control"], (*CONTROL_PLANE, "model_signing")) == [
        "prefect", "mlflow", "scipy", "model_signing"]


def test_a_command_from_a_host_without_its_extra_names_the_pip_command(hosts: dict[str, Path]) -> None:
    cases = [("router", ("worker", "--port", "1", "--cache", "cache", "--token-file", "token"), "worker", "uvicorn"),
             # The first library the router reaches: its HTTP parser.
             ("bare", ("router", "--routes", "routes", "--route", "chat"), "router", "httptools"),
             ("worker", ("promote", "chat", "improved"), "control", "httpx"),  # the first the flow code reaches
             ("control", ("models", "make", "zoo"), "zoo", "torch")]
    for kind, args, extra, module in cases:
        done = revgate_in(hosts[kind], *args)
        assert done.returncode == 2, (kind, args, done.stdout, done.stderr)
        assert f"needs {module}" in done.stderr, (kind, done.stderr)
        assert f'pip install "revgate[{extra}]"' in done.stderr, (kind, done.stderr)
        assert "Traceback" not in done.stderr


def test_promote_runs_from_the_control_extra(hosts: dict[str, Path]) -> None:
    # As far as a rollout goes without a Prefect server: its flow code loads, and the API is asked for.
    done = revgate_in(hosts["control"], "promote", "chat", "improved",
                      extra_env={"PREFECT_API_URL": "http://127.0.0.1:9/api"})
    assert done.returncode == 2 and "the Prefect API cannot be reached" in done.stderr, done.stdout + done.stderr


def test_the_control_host_applies_the_deployments_the_package_carries(hosts: dict[str, Path],
                                                                      prefect_api: str) -> None:
    # From outside any checkout: `revgate deploy` applies the prefect.yaml inside the installed package.
    done = revgate_in(hosts["control"], "deploy", extra_env={"PREFECT_API_URL": prefect_api})
    assert done.returncode == 0, done.stdout + done.stderr
    packaged = hosts["control"].glob("lib/python*/site-packages/revgate/flows/prefect.yaml")
    assert f"applied from {next(packaged)}" in done.stdout, done.stdout
    missing = revgate_in(hosts["control"], "deploy", "--prefect-file", "nowhere.yaml",
                         extra_env={"PREFECT_API_URL": prefect_api})
    assert missing.returncode == 2 and "no such deployments file" in missing.stderr, missing.stderr


@pytest.fixture
def light_worker(hosts: dict[str, Path], tmp_path: Path) -> Iterator[tuple[WorkerClient, subprocess.Popen[bytes]]]:
    """``revgate worker`` from the [worker] environment, its engines from the engine environment."""
    write_token(tmp_path / "token", TOKEN)
    port = free_port()
    with (tmp_path / "worker.log").open("wb") as log:
        process = subprocess.Popen(
            [str(hosts["worker"] / "bin" / "revgate"), "worker", "--port", str(port),
             "--cache", str(tmp_path / "cache"), "--token-file", str(tmp_path / "token"),
             "--engine-python", str(engine_python()),
             "--startup-timeout", str(START_TIMEOUT_S)],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, 60, process)
        yield WorkerClient(f"http://127.0.0.1:{port}", TOKEN), process
    finally:
        stop(process, grace_s=60)  # the agent drains its replicas first


def test_a_router_and_a_worker_agent_serve_from_their_light_environments(
    hosts: dict[str, Path], light_worker: tuple[WorkerClient, subprocess.Popen[bytes]], zoo_dir: Path,
    tmp_path: Path,
) -> None:
    client, agent = light_worker
    request = published_request(tmp_path, zoo_dir / load_revisions(zoo_dir)["stable"].path)
    started = client.start(request)
    ready = client.wait_for(started.replica_id, {"ready"}, START_TIMEOUT_S)
    assert ready.state == "ready", ready
    first = RouteSnapshot.build(
        route="edge", generation=1, created_by="tests", created_at=datetime.now(UTC).isoformat(), reveal_revision=True,
        stable={"fingerprint": request.revision.fingerprint, "endpoints": [ready.endpoint],
                "served_model": ready.served_model},
    )
    (tmp_path / "router").mkdir()
    light_router = (str(hosts["router"] / "bin" / "revgate"),)
    with router_process(tmp_path / "router", "edge", first, program=light_router) as router:
        status, headers, body = completion(router.url, "edge", 6)
        assert status == 200, body
        assert headers["x-revgate-revision"] == request.revision.fingerprint
        assert json.loads(body)["usage"]["completion_tokens"] == 6
        wait_until(lambda: len(router.records_lines()) >= 1, 30, "the router records the answer")
        assert router.process.poll() is None
    # The agent's SIGTERM drains its replica: the engine it started ends with it.
    agent.send_signal(signal.SIGTERM)
    agent.wait(60)
    wait_until(lambda: not pid_alive(ready.pid), 30, "the engine ends with its agent")
