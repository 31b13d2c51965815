"""Run a worker agent and its control API on one asyncio loop (the ``revgate worker`` command)."""

from __future__ import annotations

import logging
from pathlib import Path

import uvicorn

from revgate.serving.worker.agent import WorkerAgent
from revgate.serving.worker.api import ControlApp
from revgate.serving.worker.auth import load_token
from revgate.serving.worker.cache_lock import hold_cache
from revgate.serving.worker.cores import DEFAULT_TURN_EVERY_S
from revgate.serving.worker.engine import Device


async def serve_worker(
    *,
    host: str,
    port: int,
    cache: Path,
    token_file: Path,
    device: Device = "cpu",
    engine_python: Path | None = None,
    startup_timeout_s: float = 300.0,
    stop_timeout_s: float = 15.0,
    cpu_slots: int = 2,
    cpu_turn_every_s: float = DEFAULT_TURN_EVERY_S,
    replica_host: str | None = None,
    keep_replicas: bool = False,
) -> None:
    """Serve until SIGINT/SIGTERM; the token is checked before anything listens.

    ``host`` is the control API's address; ``replica_host`` (default: the same) the replica proxies',
    so the control API can sit on a management network the routers' traffic never reaches.
    """
    token = load_token(token_file)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with hold_cache(cache):
        agent = WorkerAgent(cache, device=device, engine_python=engine_python, host=replica_host or host,
                            startup_timeout_s=startup_timeout_s, stop_timeout_s=stop_timeout_s, cpu_slots=cpu_slots,
                            keep_replicas=keep_replicas, turn_every_s=cpu_turn_every_s)
        config = uvicorn.Config(ControlApp(agent, token), host=host, port=port, log_level="warning",
                                lifespan="on", access_log=False)
        await uvicorn.Server(config).serve()
