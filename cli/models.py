"""revgate command-line: ``models make`` (build the reference zoo) and ``models eval`` (measure it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEFAULT_PER_SLICE = 300  # the same as zoo.evaluate.DEFAULT_PER_SLICE, without importing torch for --help


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``models make`` and ``models eval``."""
    models = subparsers.add_parser("models", help="the reference model zoo: tiny trained revisions")
    commands = models.add_subparsers(dest="models_command", required=True)

    make = commands.add_parser("make", help="train the zoo into OUT_DIR (reused when already current)")
    make.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    make.add_argument(
        "--scale", type=float, default=1.0, help="shorten every training schedule (quick trials; not the reference zoo)"
    )
    make.set_defaults(func=_make)

    evaluate = commands.add_parser("eval", help="serve each revision with vLLM and measure accuracy and speed")
    evaluate.add_argument("zoo_dir", type=Path, metavar="ZOO_DIR")
    evaluate.add_argument("--per-slice", type=int, default=DEFAULT_PER_SLICE, help="evaluation prompts per slice")
    evaluate.add_argument("--revision", action="append", default=[], help="only these revisions (repeatable)")
    evaluate.add_argument("--markdown", action="store_true", help="also print the docs table")
    evaluate.set_defaults(func=_eval)


def _make(args: argparse.Namespace) -> int:
    # Imported here: torch loads only when a models command runs, so `revgate --help` stays fast.
    from revgate.zoo.build import make_zoo
    from revgate.zoo.recipe import default_zoo

    revisions = make_zoo(args.out_dir, default_zoo(args.scale))
    for revision in revisions.values():
        print(f"{revision.name:<17} {revision.artifact_digest}  {revision.path}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from revgate.zoo.evaluate import evaluate_zoo, markdown_table

    reports = evaluate_zoo(args.zoo_dir, args.per_slice, args.revision)
    if args.markdown:
        print(markdown_table(reports))
    return 0
