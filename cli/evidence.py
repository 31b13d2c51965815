"""revgate command-line: ``evidence``, the auditor's check of a revision's promotion evidence."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from manifests.errors import RevgateError

EXIT_ALTERED = 4


class EvidenceNotFound(RevgateError):
    """No promotion run of the revision is in the tracking store."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``evidence``."""
    parser = subparsers.add_parser(
        "evidence",
        help="trace a revision's promotion evidence in MLflow and check every document against its digest "
             "(and every signed approval's signature, verified again)",
    )
    parser.add_argument("revision", help="the revision's fingerprint (sha256:...), or its first characters")
    parser.add_argument("--tracking-uri", required=True, help="MLflow tracking URI (sqlite:///FILE or http://HOST)")
    parser.add_argument("--model", default="revgate-model", help="registered model to read aliases from")
    parser.add_argument("--json", action="store_true", help="print the audit as JSON")
    parser.set_defaults(func=run_evidence)


def run_evidence(args: argparse.Namespace) -> int:
    """Print the audit; exit 0 when intact, 4 when a document was altered or lost or an approval's signature
    does not verify."""
    from registry.audit import audit_json, render
    from registry.ledger import EvidenceLedger

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per document otherwise

    ledger = EvidenceLedger(args.tracking_uri, Path.cwd())
    # The short form route history prints (12 hex digits) names a revision too.
    revision = args.revision if args.revision.startswith("sha256:") else f"sha256:{args.revision}"
    runs = ledger.evidence_of(revision)
    if not runs:
        raise EvidenceNotFound(
            f"no promotion run of revision {args.revision!r}",
            where=args.tracking_uri,
            fix="Check the tracking URI (the demo prints its own) and the fingerprint (`revgate route history`).",
        )
    aliases = ledger.aliases_of(args.model, revision)
    if args.json:
        print(json.dumps(audit_json(runs, aliases), indent=2, default=str))
    else:
        print(render(runs, aliases))
    return 0 if all(run.intact for run in runs) else EXIT_ALTERED
