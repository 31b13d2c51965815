"""The engine command line and environment: pure functions of the execution config."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from revgate.manifests.revision import ExecutionConfig
from revgate.serving.worker.agent import SupervisedEngine
from revgate.serving.worker.engine import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    EngineError,
    EngineProcess,
    LoraModule,
    engine_command,
    engine_env,
    engine_python,
    free_port,
    port_is_open,
    session_members,
)

PY = Path("env/bin/python")


def flag(command: list[str], name: str) -> str:
    """The value after ``name`` in ``command``."""
    return command[command.index(name) + 1]


def test_cpu_command_serves_the_model_on_the_port_with_a_bounded_kv_cache() -> None:
    execution = ExecutionConfig.build(dtype="float32", max_model_len=128, enforce_eager=True)
    command = engine_command(Path("zoo/stable"), execution, 8123, "stable-abc", python=PY)
    assert command[:5] == [str(PY), "-m", "vllm.entrypoints.openai.api_server", "--model", "zoo/stable"]
    assert flag(command, "--port") == "8123"
    assert flag(command, "--host") == "127.0.0.1"  # loopback only: no other host reaches vLLM's own API
    assert flag(command, "--served-model-name") == "stable-abc"
    assert flag(command, "--dtype") == "float32"
    assert flag(command, "--max-model-len") == "128"
    assert flag(command, "--kv-cache-memory-bytes") == str(DEFAULT_CPU_KV_CACHE_BYTES)
    assert flag(command, "--distributed-executor-backend") == "uni"
    assert "--enforce-eager" in command
    assert "--gpu-memory-utilization" not in command
    assert "--enable-lora" not in command


def test_cpu_command_uses_the_configured_kv_cache_and_batching_limits() -> None:
    execution = ExecutionConfig.build(kv_cache_bytes=32 << 20, max_num_seqs=8, max_num_batched_tokens=512)
    command = engine_command(Path("m"), execution, 1, "m", python=PY)
    assert flag(command, "--kv-cache-memory-bytes") == str(32 << 20)
    assert flag(command, "--max-num-seqs") == "8"
    assert flag(command, "--max-num-batched-tokens") == "512"
    assert "--enforce-eager" not in command


def test_gpu_command_has_parallel_layout_and_memory_share_and_no_cpu_settings() -> None:
    execution = ExecutionConfig.build(tensor_parallel_size=2, gpu_memory_utilization="0.85", dtype="bfloat16")
    command = engine_command(Path("m"), execution, 9000, "m", device="cuda", python=PY)
    assert flag(command, "--tensor-parallel-size") == "2"
    assert flag(command, "--pipeline-parallel-size") == "1"
    assert flag(command, "--gpu-memory-utilization") == "0.85"
    assert flag(command, "--dtype") == "bfloat16"
    assert "--distributed-executor-backend" not in command
    assert "--kv-cache-memory-bytes" not in command


def test_cpu_refuses_tensor_parallelism_with_a_clear_error() -> None:
    execution = ExecutionConfig.build(tensor_parallel_size=2)
    with pytest.raises(EngineError, match="not supported on the CPU"):
        engine_command(Path("m"), execution, 1, "m", python=PY)


def test_lora_modules_are_served_by_name_with_the_rank() -> None:
    execution = ExecutionConfig.build(enable_lora=True, max_lora_rank=8)
    adapter = LoraModule("stable-lora", Path("zoo/adapter"))
    command = engine_command(Path("m"), execution, 1, "m", lora_modules=[adapter], python=PY)
    assert "--enable-lora" in command
    assert flag(command, "--max-lora-rank") == "8"
    assert flag(command, "--lora-modules") == "stable-lora=zoo/adapter"


def test_lora_modules_without_enable_lora_are_refused() -> None:
    with pytest.raises(EngineError, match="does not enable LoRA"):
        engine_command(Path("m"), ExecutionConfig.build(), 1, "m", lora_modules=[LoraModule("a", Path("a"))])


def test_cpu_env_selects_the_cpu_backend_offline_in_one_process() -> None:
    env = engine_env(ExecutionConfig.build(), "cpu", base={"PATH": "/bin"})
    assert env["VLLM_TARGET_DEVICE"] == "cpu"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["PATH"] == "/bin"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env


def test_gpu_env_drops_cpu_only_settings_and_lora_allows_runtime_updates() -> None:
    base = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env = engine_env(ExecutionConfig.build(enable_lora=True), "cuda", base=base)
    assert "VLLM_TARGET_DEVICE" not in env
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_wait_before_start_is_a_clear_error(tmp_path: Path) -> None:
    process = EngineProcess(["true"], {}, free_port(), log_path=tmp_path / "log")
    with pytest.raises(EngineError, match="not started"):
        process.wait_healthy(1)


def test_the_default_engine_is_the_project_engine_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REVGATE_ENGINE_PYTHON", raising=False)
    python = engine_python()
    assert python.parts[-3:] == (".venv-engine", "bin", "python")
    assert (python.parents[2] / "pyproject.toml").is_file()  # the project root, wherever the module sits


def test_stop_kills_an_engine_that_ignores_sigterm_and_says_so(tmp_path: Path) -> None:
    port = free_port()
    stubborn = (  # listens like an engine and ignores SIGTERM, as a hung server does
        "import signal, socket, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"s = socket.create_server(('127.0.0.1', {port})); time.sleep(600)"
    )
    process = SupervisedEngine([sys.executable, "-c", stubborn], {}, port, log_path=tmp_path / "log")
    process.start()
    deadline = time.monotonic() + 30
    while not port_is_open(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.stop(grace=0.5) is True
    assert process.exit_code() == -signal.SIGKILL
    assert not port_is_open(port)
    quiet = EngineProcess([sys.executable, "-c", "import time; time.sleep(600)"], {}, free_port(),
                          log_path=tmp_path / "log2")
    quiet.start()
    assert quiet.stop(grace=30) is False  # SIGTERM was enough


@pytest.mark.parametrize("child_ignores_sigterm", [False, True])
def test_the_children_of_a_server_that_died_are_stopped_with_it(tmp_path: Path, child_ignores_sigterm: bool) -> None:
    # The defect: vLLM's API server killed (or crashed) left its EngineCore child running for ever,
    # because stop() signalled the engine's process group only while the server itself still ran.
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if child_ignores_sigterm else ""
    ready = tmp_path / "child-ready"  # written once the child's signal handling is in place, not merely once it runs
    child = f"import signal; {ignore}open({str(ready)!r}, 'w').close(); signal.pause()"
    server = (  # a server and its engine child, in the server's session, as vLLM's are
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(600)"
    )
    engine = SupervisedEngine([sys.executable, "-c", server], {}, free_port(), log_path=tmp_path / "log")
    engine.start()
    assert engine.pid is not None
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(session_members(engine.pid)) == 2, "the stand-in server did not start its child"
        os.kill(engine.pid, signal.SIGKILL)  # the server dies on its own; its child does not
        while engine.exit_code() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(session_members(engine.pid)) == 1
        assert engine.stop(grace=0.5) is child_ignores_sigterm
        assert session_members(engine.pid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGKILL)  # a failing run leaves nothing behind either
