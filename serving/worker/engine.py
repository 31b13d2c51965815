"""The engine launcher: the vLLM OpenAI-compatible server as a subprocess in its own environment.

The command line and environment are pure functions of the execution config ``c`` (so the same
revision always starts the same way); :class:`EngineProcess` is the thin I/O edge that starts the
server, waits for ``/health``, and stops it with the port released.

vLLM runs in a separate virtual environment (``.venv-engine``: it pins libraries the control plane
cannot share), which is why it is a subprocess and never imported here.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import http.client
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Literal, Self
from urllib.parse import urlsplit

from revgate.manifests.errors import RevgateError
from revgate.manifests.revision import ExecutionConfig
from revgate.serving.worker.cores import Slot, moved_affinity

Device = Literal["cpu", "cuda"]
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# A default that fits beside other work on a small CPU host; vLLM's own default asks for ~92% of a
# NUMA node and fails to start there.
DEFAULT_CPU_KV_CACHE_BYTES = 64 * 1024 * 1024
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM listens on loopback only, whatever address the worker serves on: every path it offers
# (runtime LoRA loading among them) is reachable from this host alone, and the outside world
# sees only the worker's proxy with its allow-list.
ENGINE_HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
KILL_WAIT_S = 10.0  # after SIGKILL, only a process stuck in the kernel is still there
PORT_RELEASE_S = 10.0  # how long a stop waits for the port once the process ended


class EngineError(RevgateError):
    """The engine could not be started, did not become healthy, or would not stop."""


class EngineExited(EngineError):
    """The engine process exited before it became healthy."""


class EngineStartTimeout(EngineError):
    """The engine did not answer ``/health`` with 200 within the startup timeout."""


@dataclass(frozen=True, slots=True)
class LoraModule:
    """A LoRA adapter served by name beside its base model (``--lora-modules name=path``)."""

    name: str
    path: Path


def engine_python() -> Path:
    """The engine environment's interpreter: ``$REVGATE_ENGINE_PYTHON`` or the project's ``.venv-engine``."""
    configured = os.environ.get("REVGATE_ENGINE_PYTHON")
    return Path(configured) if configured else PROJECT_ROOT / ".venv-engine" / "bin" / "python"


def engine_command(
    model_dir: Path,
    execution: ExecutionConfig,
    port: int,
    served_model_name: str,
    *,
    device: Device = "cpu",
    lora_modules: Sequence[LoraModule] = (),
    python: Path | None = None,
) -> list[str]:
    """The argument list that serves ``model_dir`` under ``served_model_name`` on loopback ``port``."""
    command = [str(python or engine_python()), "-m", SERVER_MODULE, "--model", str(model_dir)]
    command += ["--served-model-name", served_model_name, "--host", ENGINE_HOST, "--port", str(port)]
    command += _model_flags(execution)
    command += _cpu_flags(execution) if device == "cpu" else _gpu_flags(execution)
    command += _lora_flags(execution, lora_modules)
    return command


def _model_flags(execution: ExecutionConfig) -> list[str]:
    flags = ["--dtype", execution.dtype, "--max-model-len", str(execution.max_model_len)]
    flags += ["--max-num-seqs", str(execution.max_num_seqs), "--disable-uvicorn-access-log"]
    if execution.max_num_batched_tokens is not None:
        flags += ["--max-num-batched-tokens", str(execution.max_num_batched_tokens)]
    if execution.quantization is not None:
        flags += ["--quantization", execution.quantization]
    if execution.enforce_eager:
        flags.append("--enforce-eager")
    return flags


def _cpu_flags(execution: ExecutionConfig) -> list[str]:
    if execution.tensor_parallel_size > 1 or execution.pipeline_parallel_size > 1:
        raise EngineError(
            "tensor or pipeline parallelism is not supported on the CPU engine",
            where="ExecutionConfig.tensor_parallel_size / pipeline_parallel_size",
            fix="Use parallel size 1 for CPU serving, or serve this revision on a GPU worker.",
        )
    kv_bytes = execution.kv_cache_bytes or DEFAULT_CPU_KV_CACHE_BYTES
    # One process, no worker processes: the fastest start on a small host.
    return ["--kv-cache-memory-bytes", str(kv_bytes), "--distributed-executor-backend", "uni"]


def _gpu_flags(execution: ExecutionConfig) -> list[str]:
    flags = ["--tensor-parallel-size", str(execution.tensor_parallel_size)]
    flags += ["--pipeline-parallel-size", str(execution.pipeline_parallel_size)]
    if execution.gpu_memory_utilization is not None:
        flags += ["--gpu-memory-utilization", str(execution.gpu_memory_utilization)]
    if execution.kv_cache_bytes is not None:
        flags += ["--kv-cache-memory-bytes", str(execution.kv_cache_bytes)]
    return flags


def _lora_flags(execution: ExecutionConfig, lora_modules: Sequence[LoraModule]) -> list[str]:
    if lora_modules and not execution.enable_lora:
        raise EngineError(
            "LoRA modules were given but the execution config does not enable LoRA",
            where="ExecutionConfig.enable_lora",
            fix="Set enable_lora (and max_lora_rank) in the execution config, or serve without adapters.",
        )
    if not execution.enable_lora:
        return []
    flags = ["--enable-lora"]
    if execution.max_lora_rank is not None:
        flags += ["--max-lora-rank", str(execution.max_lora_rank)]
    if lora_modules:
        flags += ["--lora-modules", *(f"{module.name}={module.path}" for module in lora_modules)]
    return flags


def engine_env(
    execution: ExecutionConfig, device: Device = "cpu", base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The engine's environment: ``base`` (default: this process's) plus the settings vLLM needs."""
    env = dict(os.environ if base is None else base)
    env.update({"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    if device == "cpu":
        # Without it the AVX512 kernels load and the process dies of SIGILL on AVX2-only hosts.
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    else:
        for name in ("VLLM_TARGET_DEVICE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"):
            env.pop(name, None)
    if execution.enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return env


def port_is_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the engine binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def health_status(host: str, port: int, timeout: float = 2.0) -> int | None:
    """The status of ``GET /health``, or None when nothing answers."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


def answers_health(url: str) -> bool:
    """Whether the endpoint at ``url`` (a replica proxy, or vLLM itself) answers ``GET /health`` with 200."""
    parts = urlsplit(url)
    return parts.hostname is not None and parts.port is not None and health_status(parts.hostname, parts.port) == 200


def tail_lines(path: Path, count: int = 20) -> str:
    """The last ``count`` lines of a log file (empty if it does not exist)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-count:])


def _load_libc() -> ctypes.CDLL | None:
    # Looked up here, in the parent: find_library runs ldconfig, which must not happen between
    # fork and exec in a process with threads.
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()


def stop_with_parent() -> None:
    """In the child before exec: SIGTERM it if its parent dies, so a killed run leaves no server."""
    if _LIBC is not None:
        with contextlib.suppress(AttributeError):
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _child_setup(bound_to_parent: bool, cores: tuple[int, ...]) -> Callable[[], None] | None:
    """What the engine's child runs before exec: the parent-death signal, and its cores. vLLM's own
    ``VLLM_CPU_OMP_THREADS_BIND`` binds only the workers of its multiprocess executor; a one-worker
    engine ignores it and computes on every core, so the binding is made here, for the whole session."""
    if not (bound_to_parent or cores):
        return None

    def setup() -> None:
        if bound_to_parent:
            stop_with_parent()
        if cores:
            os.sched_setaffinity(0, cores)  # every thread and process the engine makes inherits it
    return setup


LEFTOVER_GRACE_S = 5.0  # what a leftover child of a server that has gone gets after SIGTERM


def _session_stats(session_id: int) -> Iterator[tuple[int, list[str]]]:
    """(pid, /proc stat fields after the command name) of each live process in session ``session_id``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        # After the command name: state, ppid, pgrp, session, ..., utime (12th), stime (13th).
        if int(fields[3]) == session_id:
            yield int(stat.parent.name), fields


def session_members(session_id: int) -> list[int]:
    """The live processes whose session id is ``session_id`` (zombies aside). Linux only (reads /proc)."""
    return [pid for pid, fields in _session_stats(session_id) if fields[0] != "Z"]


def session_cpu_seconds(session_id: int) -> float:
    """User + system CPU seconds of the live processes whose session id is ``session_id``."""
    ticks = sum(int(fields[11]) + int(fields[12]) for _, fields in _session_stats(session_id))
    return ticks / os.sysconf("SC_CLK_TCK")


def move_session_threads(session_id: int, old: Slot, new: Slot) -> int:
    """Move every thread of session ``session_id`` bound within the cores ``old`` to the matching cores
    of ``new`` (see serving.worker.cores.moved_affinity); threads that float stay. How many moved."""
    moved = 0
    for pid, _ in list(_session_stats(session_id)):
        for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
            try:
                target = moved_affinity(frozenset(os.sched_getaffinity(int(task.name))), old, new)
                if target is not None:
                    os.sched_setaffinity(int(task.name), target)
                    moved += 1
            except OSError:
                continue  # the thread ended while we looked
    return moved


def stop_session(session_id: int, grace: float, *, where: str = "") -> bool:
    """SIGTERM every process left in session ``session_id``, SIGKILL what is still there after ``grace``;
    whether SIGKILL was needed. One that outlives SIGKILL too is an :class:`EngineError`."""
    for signum, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_S)):
        if not session_members(session_id):
            return False  # gone before this signal was needed
        with contextlib.suppress(ProcessLookupError):
            os.killpg(session_id, signum)
        deadline = time.monotonic() + wait_s
        while session_members(session_id) and time.monotonic() < deadline:
            time.sleep(0.1)
    if left := session_members(session_id):
        raise EngineError(f"processes {left} did not exit within {KILL_WAIT_S:g} s of SIGKILL",
                          where=where or f"session {session_id}",
                          fix="The process is stuck in the kernel (I/O or a driver); check the host.")
    return True


class EngineProcess:
    """One vLLM server subprocess: start, wait until healthy, stop with the port released.

    Use as a context manager so a failed test or command never leaves a server behind.
    """

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        port: int,
        host: str = "127.0.0.1",
        log_path: Path | None = None,
        *,
        outlive_parent: bool = False,
        cores: Sequence[int] = (),
    ) -> None:
        self.outlive_parent = outlive_parent  # kept across its agent's restart: no stop when the parent dies
        self.cores = tuple(cores)  # the cores it computes on (empty: every core this process may use)
        self.command = list(command)
        self.env = dict(env)
        self.host = host
        self.port = port
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="revgate-engine-", suffix=".log")[1])
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the OpenAI-compatible API (``http://host:port``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return None if self._process is None else self._process.pid

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by the engine and every process of its session.

        Unlike latency, this barely moves when other work shares the cores, so it compares the
        per-token cost of two revisions fairly on a busy host. Linux only (reads /proc).
        """
        return session_cpu_seconds(self.pid) if self.pid is not None else 0.0

    def start(self) -> None:
        """Start the server process (returns at once; see :meth:`wait_healthy`)."""
        if port_is_open(self.port, self.host):
            raise EngineError(
                f"port {self.port} is already in use", where=self.url, fix="Choose a free port (free_port())."
            )
        self._log = self.log_path.open("wb")
        # Own session: stopping the group also stops any helper process the engine spawned.
        self._process = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_child_setup(not self.outlive_parent, self.cores),  # noqa: PLW1509 - prctl and affinity only
        )

    def wait_healthy(self, timeout: float = 180.0) -> None:
        """Block until ``/health`` answers 200; raise with the last log lines on exit or timeout."""
        process = self._require_process()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise EngineExited(
                    f"the engine exited with status {process.returncode} before it became healthy; "
                    f"last log lines:\n{tail_lines(self.log_path)}",
                    where=str(self.log_path),
                    fix="Read the log; check the model directory, the engine environment and the flags.",
                )
            if health_status(self.host, self.port) == 200:
                return
            time.sleep(0.25)
        raise EngineStartTimeout(
            f"the engine was not healthy within {timeout:.0f} s; last log lines:\n{tail_lines(self.log_path)}",
            where=self.url,
            fix="Raise the startup timeout on a loaded host, or read the log for a hang.",
        )

    def stop(self, grace: float = 15.0) -> bool:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns once the port is released, and
        whether SIGKILL was needed. A process that outlives SIGKILL too is an :class:`EngineError`.
        """
        process = self._process
        killed = False
        if process is not None and process.poll() is None:
            self._signal(process, signal.SIGTERM)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                killed = True
                self._signal(process, signal.SIGKILL)
                try:
                    process.wait(KILL_WAIT_S)
                except subprocess.TimeoutExpired:
                    raise EngineError(
                        f"the engine process {process.pid} did not exit within {KILL_WAIT_S:g} s of SIGKILL",
                        where=self.url, fix="The process is stuck in the kernel (I/O or a driver); check the host.",
                    ) from None
        if process is not None:
            killed = self._stop_leftovers(process.pid, min(grace, LEFTOVER_GRACE_S)) or killed
        self._close_log()
        self._wait_port_released()
        return killed

    def _wait_port_released(self, timeout: float = PORT_RELEASE_S) -> None:
        deadline = time.monotonic() + timeout
        while port_is_open(self.port, self.host):
            if time.monotonic() > deadline:
                raise EngineError(
                    f"port {self.port} is still open after the engine stopped",
                    where=self.url,
                    fix="Another process holds the port; find it with `ss -ltnp` and stop it.",
                )
            time.sleep(0.1)

    def _stop_leftovers(self, session_id: int, grace: float) -> bool:
        """Stop what is left of the engine's session once its server has gone: vLLM's EngineCore
        child outlives a server that crashed or was killed (about 700 MB each, for ever). Whether
        SIGKILL was needed."""
        return stop_session(session_id, grace, where=self.url)

    @staticmethod
    def _signal(process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise EngineError("the engine was not started", fix="Call start() before wait_healthy().")
        return self._process

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def serve(
    model_dir: Path,
    execution: ExecutionConfig,
    served_model_name: str,
    *,
    device: Device = "cpu",
    lora_modules: Sequence[LoraModule] = (),
    log_path: Path | None = None,
) -> EngineProcess:
    """An unstarted :class:`EngineProcess` for ``model_dir`` on a free local port."""
    port = free_port()
    command = engine_command(model_dir, execution, port, served_model_name, device=device, lora_modules=lora_modules)
    return EngineProcess(command, engine_env(execution, device), port, log_path=log_path)
