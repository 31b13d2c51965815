"""revgate command-line: ``approve``, a release manager's signed answer to a paused approval form."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from revgate.manifests.errors import RevgateError


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``approve``."""
    parser = subparsers.add_parser(
        "approve",
        help="sign an approval (or rejection) of a paused rollout's evidence and send it to its approval form",
        description="Reads the evidence digest the paused flow run's approval form is bound to, signs an approval "
                    "statement (route, flow run, evidence digest, approver, approve or reject, comment) with your "
                    "EC private key in the OpenSSF model-signing format, and resumes the run with the answer and "
                    "its signature, as the Prefect UI's Resume form does. The Prefect API is PREFECT_API_URL.",
    )
    parser.add_argument("run", help="the paused flow run: its id, or its name")
    parser.add_argument("--key", required=True, type=Path, help="your PEM EC private key (P-256, P-384 or P-521)")
    parser.add_argument("--as", dest="approver", required=True,
                        help="your name, as the rollout plan's approvers and approver_keys name you")
    parser.add_argument("--reject", action="store_true", help="reject the candidate (roll back) instead of approving")
    parser.add_argument("--comment", default="", help="why; signed with the answer and kept in the evidence run")
    parser.add_argument("--prefect-api", default=os.environ.get("PREFECT_API_URL", ""),
                        help="the Prefect API the run is on (default: $PREFECT_API_URL)")
    parser.add_argument("--password-file", type=Path, help="a file holding the private key's password, if it has one")
    parser.set_defaults(func=run_approve)


def run_approve(args: argparse.Namespace) -> int:
    """Sign and send; 0 once the run took the answer (whether it counts, the flow decides and logs)."""
    if not args.prefect_api:
        raise RevgateError("no Prefect API named", where="--prefect-api",
                           fix="Set PREFECT_API_URL (or pass --prefect-api) to the server the paused run is on.")
    os.environ["PREFECT_API_URL"] = args.prefect_api  # before Prefect is imported: it reads its settings then

    from revgate.flows.approval import SignedApproval, paused_form, send_answer
    from revgate.manifests.rollout import ApprovalStatement
    from revgate.registry.signing import sign_approval, signature_key_hint
    approver = args.approver.strip()
    if not approver:
        raise RevgateError("--as names nobody", where="--as", fix="Give your name as the rollout plan lists it.")
    password = None
    if args.password_file is not None:
        try:
            password = args.password_file.read_text(encoding="utf-8").rstrip("\n")
        except OSError as error:
            raise RevgateError(f"cannot read the key's password ({error.strerror})", where=str(args.password_file),
                               fix="Give a readable file holding the password.") from None
    form = paused_form(args.run)
    statement = ApprovalStatement(route=form.route or "(unnamed)", flow_run_id=form.flow_run_id,
                                  evidence_digest=form.evidence_digest, approver=approver, approve=not args.reject,
                                  comment=args.comment)
    signature = sign_approval(statement.canonical(), args.key, password=password)
    answer = SignedApproval(approver=approver, approve=not args.reject, evidence_digest=form.evidence_digest,
                      comment=args.comment, route=form.route, statement=statement.canonical().decode("utf-8"),
                      signature=signature)
    send_answer(form, answer)
    verb = "rejection" if args.reject else "approval"
    print(f"sent a signed {verb} to flow run {form.flow_run_name} ({form.flow_run_id})")
    print(f"  route {form.route or '(not named by the form)'}, evidence {form.evidence_digest or '(none)'}")
    print(f"  as {approver}, signed with key {signature_key_hint(signature) or '(unnamed)'}")
    print("  the flow checks the signature against the rollout plan's key for you; an answer that does not count "
          "is kept in the evidence run and the form is asked again")
    return 0

