"""revgate command-line: ``revgate demo``, a full promotion on one machine."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``demo``."""
    parser = subparsers.add_parser("demo", help="run a promotion on the embedded default (one machine)")
    parser.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """Run the steps of the demo that exist so far, and say plainly what does not exist yet."""
    print("revgate demo: the end-to-end promotion flow is not built yet.")
    print("What runs today: see README.md, 'Status'.")
    return 0
