"""Long-running services of the embedded default: Prefect server, worker agent, router, MLflow UI.

Each is a real server process started here and stopped on exit; nothing is faked. By default each
runs on this host, on 127.0.0.1, with this process's environment; a :class:`Placement` runs it
elsewhere the way an operator would: under a command prefix (``ssh HOST``, ``systemd-run``, ``ip
netns exec NS``), bound to that host's address, with that host's environment and folder.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from revgate.manifests.errors import RevgateError
from revgate.serving.worker.engine import free_port, stop_session, stop_with_parent


class ServiceFailed(RevgateError):
    """A local service did not come up."""


@dataclass(frozen=True)
class Placement:
    """Where a service runs: the command prefix that reaches its host, the address it binds and is
    reached at, the environment it starts with (None: this process's) and its working folder."""

    launcher: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    environ: Mapping[str, str] | None = None
    cwd: Path | None = None

    def url(self, port: int) -> str:
        """``http://HOST:PORT`` of a service placed here."""
        return f"http://{self.host}:{port}"


LOCAL = Placement()


def wait_http(url: str, timeout_s: float, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``url`` answers 200; a process that exits first fails with its log's last lines."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise ServiceFailed(f"exited with {process.returncode} before {url} answered", where=str(log),
                                fix="Read the log:\n" + "\n".join(tail))
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - local http
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise ServiceFailed(f"{url} did not answer within {timeout_s:.0f} s", where=str(log), fix="Read the log.")


@contextmanager
def service(
    argv: Sequence[str], health_url: str, log: Path, *, env: Mapping[str, str] | None = None, timeout_s: float = 120,
    at: Placement = LOCAL,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` (under ``at``'s launcher) until the block ends; SIGTERM, then SIGKILL after 10 s.

    Readiness is asked from here, as any client of the service would reach it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    base = os.environ if at.environ is None else at.environ
    with log.open("ab") as sink:
        process = spawn([*at.launcher, *argv], stdout=sink, env={**base, **(env or {})}, cwd=at.cwd)
    try:
        wait_http(health_url, timeout_s, process, log)
        yield process
    finally:
        stop(process)


LEASE_STORAGE = "prefect.server.concurrency.lease_storage.filesystem"


def prefect_env(home: Path, port: int, host: str = "127.0.0.1") -> dict[str, str]:
    """Settings for a Prefect server and for the processes that talk to it."""
    return {
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://{host}:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }


def basic_auth_file(path: Path, user: str = "revgate") -> str:
    """A Prefect basic-auth string ``user:password`` kept in ``path`` (generated once, readable by its owner only)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created 0600 from the start, so the password is never readable by others, not even briefly.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as sink:
            sink.write(f"{user}:{secrets.token_urlsafe(24)}\n")
    auth = path.read_text(encoding="utf-8").strip()
    if ":" not in auth:
        raise ServiceFailed("the Prefect auth file does not hold user:password", where=str(path),
                            fix="Delete it to have a new one generated, or write user:password into it.")
    return auth


@contextmanager
def prefect_server(home: Path, auth_file: Path | None = None, *, at: Placement = LOCAL,
                   port: int | None = None) -> Iterator[dict[str, str]]:
    """A ``prefect server start`` on ``port`` (a free one by default); yields the environment that points at it.

    Started again on the same ``home`` and ``port``, it is the same server back: its database lives in ``home``.

    With ``auth_file`` the server asks every API call and the UI for the basic-auth string kept
    there (``PREFECT_SERVER_API_AUTH_STRING``), and the environment yielded carries it for clients
    (``PREFECT_API_AUTH_STRING``): start every Prefect client with that environment.
    """
    port = port or free_port()
    env = prefect_env(home, port, at.host)
    # Leases on disk, under ``home``: the default (in memory) forgets them when the server restarts, and the
    # slot a lease held stays counted for ever; a route's lock would refuse every later rollout.
    server_env = dict(env) | {"PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": LEASE_STORAGE}
    if auth_file is not None:
        auth = basic_auth_file(auth_file)
        env["PREFECT_API_AUTH_STRING"] = auth
        # The server's own services call its API too, so it carries the client setting as well.
        server_env |= {"PREFECT_API_AUTH_STRING": auth, "PREFECT_SERVER_API_AUTH_STRING": auth}
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", at.host, "--port", str(port)]
    # /api/health answers without the auth string, so readiness is checked the same way either way.
    with service(argv, f"{at.url(port)}/api/health", home / "server.log", env=server_env, timeout_s=180, at=at):
        yield env


def token_file(path: Path) -> Path:
    """A bearer token file (created once, readable by its owner only)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(24), encoding="utf-8")
        path.chmod(0o600)
    return path


@contextmanager
def worker_agent(cache: Path, token: Path, *, at: Placement = LOCAL) -> Iterator[str]:
    """A ``revgate worker`` on a free port (its control API and replica proxies on ``at.host``); yields its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "revgate.cli.main", "worker", "--port", str(port), "--cache", str(cache),
            "--token-file", str(token)]
    argv += ["--host", at.host] if at.host != LOCAL.host else []
    with service(argv, f"{at.url(port)}/healthz", cache / "worker.log", at=at):
        yield at.url(port)


@contextmanager
def router(routes: str, route: str, folder: Path, token: Path, *, sink: str = "", router_id: str = "",
           records_key: Path | None = None, at: Placement = LOCAL) -> Iterator[tuple[str, str]]:
    """A ``revgate router`` for ``route``, writing to the record sink ``sink`` if given (as ``router_id``, its
    objects signed with ``records_key`` if given); its public and admin URLs (both on ``at.host``)."""
    port, admin = free_port(), free_port()
    argv = [sys.executable, "-m", "revgate.cli.main",
            "router", "--routes", routes, "--route", route, "--port", str(port),
            "--admin-port", str(admin), "--admin-token-file", str(token), "--records", str(folder / "records.jsonl"),
            "--paired-records", str(folder / "paired.jsonl"), "--record-outputs", "--poll-interval", "0.5"]
    if sink:
        argv += ["--records-sink", sink, "--router-id", router_id or f"{route}-{port}"]
        argv += ["--records-key", str(records_key)] if records_key is not None else []
    argv += ["--host", at.host, "--admin-host", at.host] if at.host != LOCAL.host else []
    with service(argv, f"{at.url(port)}/health", folder / "router.log", at=at):
        yield at.url(port), at.url(admin)


def spawn(argv: Sequence[str], *, stdout: IO[bytes], env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a service in a session (and process group) of its own, stderr into ``stdout``.

    Its own group, so :func:`stop` reaches whatever it spawned (Prefect's and MLflow's servers run
    their web servers as children) and a Ctrl-C at a terminal reaches only its owner, which stops it
    in order. Started from the main thread it also gets SIGTERM when its owner dies, even by SIGKILL
    (Linux's parent-death signal follows the thread that started it, so only the main thread's, which
    lives as long as the process, is used).
    """
    owner_bound = threading.current_thread() is threading.main_thread()
    return subprocess.Popen(list(argv), stdout=stdout, stderr=subprocess.STDOUT, env=dict(env) if env else None,
                            cwd=cwd, start_new_session=True,
                            preexec_fn=stop_with_parent if owner_bound else None)  # noqa: PLW1509 - prctl only


def stop(process: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """Ask a child to stop (SIGTERM to its group when it leads one), then kill what is left after ``grace_s``;
    whatever else its session still holds once it has exited (a web server's workers) is stopped too."""
    group = _own_group(process)
    _signal(process, group, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        _signal(process, group, signal.SIGKILL)
        process.wait(10)
    if group:
        stop_session(process.pid, grace_s)


def _own_group(process: subprocess.Popen[Any]) -> bool:
    """Whether ``process`` leads a process group of its own (started by :func:`spawn` or with a new session)."""
    try:
        return os.getpgid(process.pid) == process.pid
    except ProcessLookupError:
        return False  # already gone (and waited for): nothing to signal


def _signal(process: subprocess.Popen[Any], group: bool, signum: int) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)


@contextmanager
def mlflow_ui(tracking_uri: str, log: Path, *, at: Placement = LOCAL, artifacts: Path | None = None,
              port: int | None = None) -> Iterator[str]:
    """``mlflow server`` over the tracking store (the UI at ``/``) on ``port`` (a free one by default), for as
    long as the block runs; its URL. Started again on the same store and port, it is the same server back.

    The evidence files clients log through it are kept in ``artifacts`` (default: beside the log), on the
    server's host: never in whatever folder the server was started from."""
    port = port or free_port()
    destination = (artifacts or log.parent / "mlflow-artifacts").resolve()
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri, "--host", at.host,
            "--port", str(port), "--workers", "1", "--artifacts-destination", str(destination)]
    # MLflow answers only Host headers naming localhost unless told which others are this server's.
    argv += ["--allowed-hosts", f"{at.host}:{port},{at.host}"] if at.host != LOCAL.host else []
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with service(argv, f"{at.url(port)}/health", log, env=env, timeout_s=180, at=at):
        yield at.url(port)


def _interrupted(*_: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """For the block, SIGTERM stops the main thread as Ctrl-C does, so every ``with`` that started a
    child stops it on the way out. Left to its default, SIGTERM ends the owner at once, and its
    children (each in a session of its own) run on with no parent."""
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_for_interrupt() -> None:
    """Block until Ctrl-C (SIGINT) or SIGTERM; the caller's cleanup runs after.

    Both are handled here rather than left to KeyboardInterrupt: a process started in the background
    of a non-interactive shell inherits SIGINT as ignored, and Python then raises nothing on Ctrl-C.
    """
    stopped = threading.Event()
    previous = {signum: signal.signal(signum, lambda *_: stopped.set()) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopped.wait(1.0):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
