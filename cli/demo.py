"""revgate command-line: ``revgate demo``, a full promotion on one machine."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``demo``."""
    parser = subparsers.add_parser("demo", help="run a promotion on the embedded default (one machine)")
    parser.add_argument("--state", type=Path, default=Path(".cache/demo"), help="demo state folder")
    parser.add_argument("--zoo", type=Path, default=Path(".cache/zoo"), help="reference zoo folder (built if missing)")
    parser.add_argument("--candidate", default="improved",
                        help="zoo revision to promote (try slice-regressed), or stable-copy or stable-reconfigured: "
                        "candidates that behave exactly like stable (A/A checks)")
    parser.add_argument("--approval", choices=("auto", "ui"), default="auto",
                        help="auto: approve without a human (demo); ui: pause for the Prefect UI's Resume form")
    parser.add_argument("--zoo-scale", type=float, default=1.0, help="shorten zoo training (quick trials only)")
    parser.add_argument("--exit", action="store_true",
                        help="stop everything right after the decision (scripts); by default the Prefect UI, the "
                        "MLflow UI and the router with users' traffic stay up until Ctrl-C")
    parser.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """Build, sign, publish, serve, route and promote; see flows/demo.py."""
    from revgate.flows.demo import run_demo as demo

    try:
        return demo(args.state, args.zoo, candidate=args.candidate, approval=args.approval,
                    zoo_scale=args.zoo_scale, stay_up=not args.exit)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM mid-run: every service it started has been stopped
        print("revgate demo: interrupted; every process it started is stopped")
        return 130
