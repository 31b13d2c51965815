"""The ``revgate`` command. Each command module registers its own subcommands.

Heavy imports (prefect, mlflow, torch, vllm clients) happen inside command handlers, so
``revgate --help`` and the data-plane commands start fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from revgate.cli.extras import missing_extra
from revgate.manifests.errors import RevgateError

# Each module defines ``register(subparsers)`` and sets ``func`` on its parsers.
COMMAND_MODULES = (
    "revgate.cli.artifacts",
    "revgate.cli.models",
    "revgate.cli.worker",
    "revgate.cli.routes",
    "revgate.cli.status",
    "revgate.cli.rollout",
    "revgate.cli.gc",
    "revgate.cli.promote",
    "revgate.cli.evidence",
    "revgate.cli.approve",
    "revgate.cli.evaluate",
    "revgate.cli.demo",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser."""
    parser = argparse.ArgumentParser(
        prog="revgate", description="Release engineering for LLM model revisions: pin, verify, warm, gate, promote."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit code 0 only on success, 2 on a revgate error with its explanation."""
    args = build_parser().parse_args(argv)
    # MLflow draws a progress bar per evidence download: `revgate promote`'s live view and `revgate status`
    # read the gate reports every few seconds, and each read would print one.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        result: int = args.func(args)
    except ModuleNotFoundError as missing:
        explained = missing_extra(missing, args.command)
        if explained is None:
            raise
        return refused(explained)
    except RevgateError as error:
        return refused(error)
    return result


def refused(error: RevgateError) -> int:
    """Print the error with its explanation; exit code 2."""
    print(f"revgate: {type(error).__name__}: {error}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
