"""revgate command-line: ``evidence``, the auditor's check of a revision's promotion evidence."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from revgate.manifests.errors import RevgateError

EXIT_ALTERED = 4
EXIT_REGISTRY_DISAGREES = 5


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
    parser.add_argument("--model", default="",
                        help="registered model to read aliases from (default: named after the revision's route)")
    parser.add_argument("--routes", default="",
                        help="route store (DIR, file:///DIR or s3://BUCKET/PREFIX): show the route's stable history "
                             "beside the registry's alias stable, and fail (exit 5) when they disagree")
    parser.add_argument("--approver-key", action="append", default=[], metavar="NAME=FILE",
                        help="the public key (PEM file) you trust for an approver, to verify signed approvals with "
                             "(repeatable); never a key found in the run")
    parser.add_argument("--controller-key", default="", metavar="FILE",
                        help="the controller's public key (PEM file) you trust, to verify each signed release "
                             "decision with; never a key found in the run")
    parser.add_argument("--site", default="",
                        help="a site configuration whose plans' approver_keys you trust (besides --approver-key), "
                             "whose route's controller_public_key you trust (unless --controller-key) and whose "
                             "route_store holds the route's history (unless --routes)")
    parser.add_argument("--json", action="store_true", help="print the audit as JSON")
    parser.set_defaults(func=run_evidence)


class ApproverKeyInvalid(RevgateError):
    """An --approver-key is not NAME=FILE, or its file holds no readable key."""


def trusted_keys(given: list[str], site: str) -> dict[str, str]:
    """Approver (casefolded) -> PEM text, from the site configuration's plans, then --approver-key (which wins)."""
    from revgate.registry.signing import public_key_pem

    keys: dict[str, str] = {}
    if site:
        from revgate.flows.site import load_site  # only an audit that names a site reads one

        for plan in load_site(Path(site)).plans.values():
            keys |= {name.casefold(): public_key_pem(key) for name, key in plan.approver_keys.items()}
    for item in given:
        name, sep, file = item.partition("=")
        if not sep or not name.strip() or not file.strip():
            raise ApproverKeyInvalid(f"--approver-key {item!r} is not NAME=FILE", where="--approver-key",
                                     fix="Give the approver's name as the plan lists it, then =, then a PEM file.")
        keys[name.strip().casefold()] = public_key_pem(file.strip())
    return keys


class ControllerKeyInvalid(RevgateError):
    """The controller's public key the auditor named cannot be read."""


def read_public_key(file: str, where: str) -> str:
    """The PEM text of a public key file the auditor trusts; ControllerKeyInvalid when unreadable."""
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ControllerKeyInvalid(f"cannot read the controller's public key ({error})", where=where,
                                   fix="Give the controller's PEM public key file (the site's "
                                       "controller_public_key).") from None
    if "-----BEGIN PUBLIC KEY-----" not in text:
        raise ControllerKeyInvalid(f"{file} holds no PEM public key", where=where,
                                   fix="Give the controller's public key, never its private key.")
    return text


def site_route(site: str, route: str) -> Any | None:
    """The site configuration's settings of ``route`` (None without --site, or when it has no such route)."""
    if not site:
        return None
    from revgate.flows.site import load_site

    return load_site(Path(site)).routes.get(route)


def run_evidence(args: argparse.Namespace) -> int:
    """Print the audit; exit 0 when intact, 4 when a document was altered or lost, an approval's signature does
    not verify, or a release decision is not signed, not what the run holds, or not in the route's history."""
    from revgate.registry.audit import anchor_in_history, audit_json, render
    from revgate.registry.ledger import EvidenceLedger

    trusted = trusted_keys(args.approver_key, args.site)  # a bad key file is refused before anything is read
    given = read_public_key(args.controller_key, "--controller-key") if args.controller_key else None
    ledger = EvidenceLedger(args.tracking_uri, Path.cwd())
    # The short form route history prints (12 hex digits) names a revision too.
    revision = args.revision if args.revision.startswith("sha256:") else f"sha256:{args.revision}"
    route = ledger.route_of(revision)
    if route is None:
        raise EvidenceNotFound(
            f"no promotion run of revision {args.revision!r}",
            where=args.tracking_uri,
            fix="Check the tracking URI (the demo prints its own) and the fingerprint (`revgate route history`).",
        )
    settings = site_route(args.site, route)
    controller = given or (read_public_key(settings.controller_public_key, f"{args.site}: routes.{route}."
                                           "controller_public_key")
                           if settings is not None and settings.controller_public_key else None)
    runs = ledger.evidence_of(revision, trusted, controller)
    store = args.routes or (settings.route_store if settings is not None else "")
    runs = anchor_in_history(runs, route_history(store, route), store)
    model = args.model or route
    aliases = ledger.aliases_of(model, revision)
    followed = route_beside_registry(ledger, model, args.routes, route) if args.routes else None
    if args.json:
        audit = audit_json(runs, aliases)
        if followed is not None:
            audit["registry"] = {"model": model, "disagreement": followed[1], "table": followed[0]}
        print(json.dumps(audit, indent=2, default=str))
    else:
        print(render(runs, aliases))
        if followed is not None:
            print(f"\n{followed[0]}")
    if followed is not None and followed[1] is not None:
        print(f"error: the registry disagrees with the route: {followed[1]}. Fix: roll back or forward with "
              f"`revgate rollback --tracking-uri {args.tracking_uri}` or a new rollout, which move the alias; the "
              "route store is the truth.")
        return EXIT_REGISTRY_DISAGREES
    return 0 if all(run.intact for run in runs) else EXIT_ALTERED


def route_beside_registry(ledger: Any, model: str, routes: str, route: str) -> tuple[str, str | None]:
    """The route's stable changes beside the alias's moves, and why they disagree now (None when they agree)."""
    from revgate.registry.follow import disagreement, side_by_side, stable_changes
    from revgate.registry.route_store import open_route_store

    store = open_route_store(routes)
    changes = stable_changes(store.back(route))
    if not changes:
        return f"route {route}: no snapshot in {routes}", None
    moves = ledger.alias_history(model) if ledger.alias_target(model, "stable") is not None else []
    versions = {str(m.get("version")): ledger.version_fingerprint(model, str(m.get("version")))
                for m in moves if m.get("version") is not None}
    current = store.read(route)
    assert current is not None
    return side_by_side(model, changes, moves, versions), disagreement(
        model, ledger.alias_fingerprint(model, "stable"), current)


def route_history(store: str, route: str) -> list[Any] | None:
    """Every generation of ``route`` in the route store ``store``; None when no store was named."""
    if not store:
        return None
    from revgate.registry.route_store import open_route_store

    return list(open_route_store(store).history(route))
