"""revgate command-line: the worker agent (``revgate worker --host H --port P --cache DIR --token-file F``)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from revgate.serving.worker.cores import DEFAULT_TURN_EVERY_S
from revgate.serving.worker.engine import EngineError, engine_python


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``revgate worker``."""
    parser = subparsers.add_parser("worker", help="run the worker agent that owns this host's vLLM replicas")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address of the control API (and of the replica proxies unless --replica-host)")
    parser.add_argument("--replica-host", default=None,
                        help="address the replica proxies listen on, for the routers' traffic (default: --host)")
    parser.add_argument("--port", type=int, required=True, help="port of the control API")
    parser.add_argument("--cache", type=Path, required=True, help="host cache for artifacts, signatures and logs")
    parser.add_argument("--token-file", type=Path, required=True, help="file holding the control API's bearer token")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="engine device (cuda: GPU vLLM)")
    parser.add_argument("--engine-python", type=Path, default=None,
                        help="interpreter of the engine environment (default: $REVGATE_ENGINE_PYTHON or .venv-engine)")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds a replica may take to load")
    parser.add_argument("--stop-timeout", type=float, default=15.0,
                        help="seconds a stopping engine gets after SIGTERM before it is killed (SIGKILL)")
    parser.add_argument("--cpu-slots", type=int, default=2,
                        help="on the CPU: split this host's cores into N slots, one replica's engine per slot "
                        "(the least used; 0: let vLLM bind every engine to every core)")
    parser.add_argument("--cpu-turn-every", type=float, default=DEFAULT_TURN_EVERY_S, metavar="SECONDS",
                        help="on the CPU: every SECONDS the ready replicas on slots of one size move to the next "
                        "such slot, so whatever else loads some cores falls on every replica alike (0: never)")
    parser.add_argument("--keep-replicas", action="store_true",
                        help="ready replicas outlive this agent: their engines run on when it stops, and the next "
                        "agent on the cache started with this flag adopts them (same id, same endpoint); without "
                        "it, every replica is drained on shutdown and any an earlier agent left is stopped")
    parser.set_defaults(func=run)


def engine_interpreter(given: Path | None) -> Path:
    """The engine environment's interpreter, checked before the agent serves anything."""
    python = given or engine_python()
    if not python.is_file():
        raise EngineError(
            f"no engine environment: {python} does not exist", where="--engine-python",
            fix="Install vLLM in an environment of its own (docs/fleet.md) and pass its interpreter with "
            "--engine-python or $REVGATE_ENGINE_PYTHON",
        )
    return python


def run(args: argparse.Namespace) -> int:
    """Serve the control API until interrupted; on shutdown every replica is drained."""
    from revgate.serving.worker.main import serve_worker  # the [worker] extra (uvicorn)

    python = engine_interpreter(args.engine_python)
    asyncio.run(serve_worker(
        host=args.host, port=args.port, cache=args.cache, token_file=args.token_file,
        device=args.device, engine_python=python, startup_timeout_s=args.startup_timeout,
        stop_timeout_s=args.stop_timeout, cpu_slots=args.cpu_slots, cpu_turn_every_s=args.cpu_turn_every,
        replica_host=args.replica_host,
        keep_replicas=args.keep_replicas,
    ))
    return 0
