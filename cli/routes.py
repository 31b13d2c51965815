"""revgate command-line: ``route show|history|set``, ``router`` and ``router-key``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from revgate.manifests.errors import RevgateError
from revgate.manifests.route import RouteNotFound, RouteSnapshot, RouteStore

if TYPE_CHECKING:
    from revgate.registry.record_signing import RecordSigner


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``route``, ``router`` and ``router-key``."""
    route = subparsers.add_parser("route", help="show, list or change a route's snapshots")
    actions = route.add_subparsers(dest="route_command", required=True)
    show = actions.add_parser("show", help="print the current snapshot")
    _store_args(show)
    show.set_defaults(func=_show)
    history = actions.add_parser("history", help="print every committed generation, oldest first")
    _store_args(history)
    history.set_defaults(func=_history)
    change = actions.add_parser("set", help="commit the next generation (compare-and-swap)")
    _store_args(change)
    _set_args(change)
    change.set_defaults(func=_set)
    router = subparsers.add_parser("router", help="run the OpenAI-compatible router for one route")
    _router_args(router)
    router.set_defaults(func=_router)
    key = subparsers.add_parser(
        "router-key", help="make a router's record-signing key pair",
        description="Writes a new Ed25519 private key (PEM, mode 0600, never over an existing file) for "
                    "`revgate router --records-key`, and prints its public key (also written to NEW_KEY_FILE.pub) "
                    "for the route's record_signers in the site configuration.")
    key.add_argument("key_file", metavar="NEW_KEY_FILE", type=Path, help="where the private key goes")
    key.set_defaults(func=_router_key)


def _store_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--routes", required=True, help="route store: DIR, file:///DIR or s3://BUCKET/PREFIX")
    parser.add_argument("--route", default="default", help="route name (default: default)")


def _set_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stable", help="stable revision fingerprint (default: keep the current one)")
    parser.add_argument("--stable-endpoints", help="comma-separated http://host:port list")
    parser.add_argument("--stable-model", help="model name the stable endpoints serve")
    parser.add_argument("--candidate", help="candidate fingerprint; 'none' removes the candidate")
    parser.add_argument("--candidate-endpoints")
    parser.add_argument("--candidate-model")
    parser.add_argument("--weight-ppm", type=int, default=0, help="candidate share, parts per million")
    parser.add_argument("--shadow", help="shadow fingerprint; 'none' removes the shadow")
    parser.add_argument("--shadow-endpoints")
    parser.add_argument("--shadow-model")
    parser.add_argument("--sample-ppm", type=int, default=0, help="mirrored share, parts per million")
    parser.add_argument("--side-effecting-tools", default="*", help="comma-separated tool names, '*' for all")
    parser.add_argument("--lease-s", type=int, default=3600, help="candidate and shadow lease, seconds from now")
    parser.add_argument("--expect-generation", type=int, help="fail unless the store is at this generation")
    parser.add_argument("--created-by", required=True, help="who makes this change (audit trail)")
    parser.add_argument("--trusted-source-file", type=Path, action="append", default=None,
                        help="a gateway's credential file: requests carrying it (x-revgate-credential) may declare "
                             "their evidence labels; repeat for more; replaces the route's list")
    parser.add_argument("--no-trusted-sources", action="store_true", help="trust no gateway's labels")
    parser.add_argument("--reveal-revision", choices=("on", "off"),
                        help="whether every caller's answer names its revision and arm (default: keep; new: off)")


def _router_args(parser: argparse.ArgumentParser) -> None:
    _store_args(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--admin-host", default="127.0.0.1")
    parser.add_argument("--admin-port", type=int, help="admin and /metrics port (default: --port + 1)")
    parser.add_argument("--admin-token-file", type=Path, help="file holding the admin bearer token")
    parser.add_argument("--records", type=Path, help="JSON-lines request records file")
    parser.add_argument("--paired-records", type=Path, help="JSON-lines shadow paired records file")
    parser.add_argument("--record-outputs", action="store_true", help="keep output text in request records")
    parser.add_argument("--records-sink", help="record store for request and paired records, one object per router "
                        "per interval: FOLDER, file:///DIR or s3://BUCKET/PREFIX[?endpoint_url=...]")
    parser.add_argument("--router-id", help="names this router's record objects (default: HOST-PORT)")
    parser.add_argument("--records-key", type=Path,
                        help="this router's Ed25519 private key (PEM, from `revgate router-key`): signs every "
                        "record object, so the flow takes only this router's objects as its records")
    parser.add_argument("--sink-interval", type=float, default=1.0, help="seconds between record objects")
    parser.add_argument("--sink-capacity", type=int, default=100_000,
                        help="records held per kind while the record store or file cannot be written; "
                        "then the oldest are dropped")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds between store polls")
    limits = parser.add_argument_group("limits of the HTTP front (defaults in docs/router.md)")
    limits.add_argument("--max-body-bytes", type=int, help="request body cap; over it: 413 (default 4 MiB)")
    limits.add_argument("--max-header-bytes", type=int, help="request line and headers cap; over it: 431")
    limits.add_argument("--max-headers", type=int, help="header field count cap; over it: 431")
    limits.add_argument("--max-url-bytes", type=int, help="request target cap; over it: 414")
    limits.add_argument("--header-timeout", type=float, help="seconds for a request's head; then 408")
    limits.add_argument("--body-timeout", type=float, help="seconds for a request's body; then 408")
    limits.add_argument("--idle-timeout", type=float, help="seconds a kept-alive connection may sit idle")
    limits.add_argument("--max-pipelined", type=int, help="queued pipelined requests before reading pauses")
    limits.add_argument("--write-stall-timeout", type=float,
                        help="seconds a caller may read nothing while its answers wait; then cut off (default 30)")
    limits.add_argument("--max-buffered-response-bytes", type=int,
                        help="answer bytes held for one caller; over it: cut off (default 4 MiB)")
    limits.add_argument("--max-connections", type=int,
                        help="open caller connections; past it: 503 with Retry-After (default 10000)")
    limits.add_argument("--max-buffered-bytes", type=int,
                        help="answer bytes unsent to all callers; over it new requests get 503 (default 256 MiB)")
    limits.add_argument("--max-record-bytes", type=int,
                        help="answer bytes kept for the records of all requests in flight; over it new requests "
                             "get 503 (default 256 MiB)")
    limits.add_argument("--record-keep-bytes", type=int, default=1024 * 1024,
                        help="bytes of one answer kept for its record: its two ends past this (default 1 MiB)")
    limits.add_argument("--shadow-queue-bytes", type=int, help="bytes held for the shadow mirror (default 64 MiB)")


def _open(args: argparse.Namespace) -> RouteStore:
    from revgate.registry.route_store import open_route_store  # keep `revgate --help` fast

    return open_route_store(args.routes)


def _current(args: argparse.Namespace) -> RouteSnapshot:
    snapshot = _open(args).read(args.route)
    if snapshot is None:
        fix = "Create it with `revgate route set`."
        raise RouteNotFound(f"route {args.route!r} has no snapshot", where=args.routes, fix=fix)
    return snapshot


def _show(args: argparse.Namespace) -> int:
    print(json.dumps(_current(args).model_dump(mode="json"), indent=2, sort_keys=True))
    return 0


def _history(args: argparse.Namespace) -> int:
    for snapshot in _open(args).history(args.route):
        candidate = snapshot.candidate
        canary = f" candidate={candidate.short}@{candidate.weight_ppm}ppm" if candidate else ""
        shadow = f" shadow={snapshot.shadow.short}" if snapshot.shadow else ""
        print(f"{snapshot.generation:>6} {snapshot.created_at.isoformat()} {snapshot.created_by:<16} "
              f"stable={snapshot.stable.short}{canary}{shadow}")
    return 0


def _endpoints(text: str | None, previous: tuple[str, ...] | None, flag: str) -> list[str]:
    if text:
        return [item.strip() for item in text.split(",") if item.strip()]
    if previous:
        return list(previous)
    raise RevgateError(f"{flag} is required", where=flag, fix="Give a comma-separated list of http://host:port.")


def proposed_snapshot(args: argparse.Namespace, current: RouteSnapshot | None, now: datetime) -> RouteSnapshot:
    """The snapshot ``route set`` would commit on top of ``current``."""
    lease = (now + timedelta(seconds=args.lease_s)).isoformat()
    stable = current.stable if current else None
    fields: dict[str, Any] = {
        "route": args.route,
        "generation": (args.expect_generation if args.expect_generation is not None else
                       (current.generation if current else 0)) + 1,
        "stable": {
            "fingerprint": args.stable or (stable.fingerprint if stable else ""),
            "endpoints": _endpoints(args.stable_endpoints, stable.endpoints if stable and not args.stable else None,
                                    "--stable-endpoints"),
            "served_model": args.stable_model or (stable.served_model if stable and not args.stable else None),
            "limits": stable.limits.model_dump(mode="json") if stable and stable.limits and not args.stable else None,
        },
        "created_by": args.created_by,
        "created_at": now.isoformat(),
    }
    if args.candidate and args.candidate != "none":
        fields["candidate"] = {"fingerprint": args.candidate, "weight_ppm": args.weight_ppm, "lease_expires_at": lease,
                               "endpoints": _endpoints(args.candidate_endpoints, None, "--candidate-endpoints"),
                               "served_model": args.candidate_model}
    if args.shadow and args.shadow != "none":
        tools = [item.strip() for item in args.side_effecting_tools.split(",") if item.strip()]
        fields["shadow"] = {"fingerprint": args.shadow, "sample_ppm": args.sample_ppm, "lease_expires_at": lease,
                            "endpoints": _endpoints(args.shadow_endpoints, None, "--shadow-endpoints"),
                            "served_model": args.shadow_model, "side_effecting_tools": tools}
    if current is not None:
        # Absent flags keep what the route has; "none" removes a candidate or shadow.
        if args.candidate is None and current.candidate is not None:
            fields["candidate"] = current.candidate.model_dump(mode="json")
        if args.shadow is None and current.shadow is not None:
            fields["shadow"] = current.shadow.model_dump(mode="json")
        fields.update(failure_domains=current.failure_domains, request_timeout_ms=current.request_timeout_ms,
                      max_retries=current.max_retries, trusted_sources=current.trusted_sources,
                      reveal_revision=current.reveal_revision)
        if fields.get("candidate") or fields.get("shadow"):
            fields.update(cohort_secret=current.cohort_secret, probe_credential=current.probe_credential)
    if args.trusted_source_file or args.no_trusted_sources:
        from revgate.serving.token_file import credential_digest

        fields["trusted_sources"] = [credential_digest(path, flag="--trusted-source-file")
                                     for path in args.trusted_source_file or ()]
    if args.reveal_revision is not None:
        fields["reveal_revision"] = args.reveal_revision == "on"
    return RouteSnapshot.build(**fields)



def _set(args: argparse.Namespace) -> int:
    store = _open(args)
    snapshot = proposed_snapshot(args, store.read(args.route), datetime.now(UTC))
    store.write(snapshot)
    print(f"route {snapshot.route}: committed generation {snapshot.generation}")
    return 0


def _router(args: argparse.Namespace) -> int:
    from revgate.serving.admin_token import load_admin_token  # data plane only here
    from revgate.serving.router.limits import Limits
    from revgate.serving.router.service import RouterConfig, check_config, run_router

    token = load_admin_token(args.admin_token_file) if args.admin_token_file else None
    given = {name: getattr(args, flag) for name, flag in _LIMIT_FLAGS.items() if getattr(args, flag) is not None}
    shadow_bytes = {"shadow_queue_bytes": args.shadow_queue_bytes} if args.shadow_queue_bytes is not None else {}
    router_id = args.router_id or f"{socket.gethostname()}-{args.port}"
    signer = _records_signer(args)
    config = RouterConfig(route=args.route, records=args.records, paired_records=args.paired_records,
                          records_sink=args.records_sink, router_id=router_id, sink_interval_s=args.sink_interval,
                          records_signer=signer,
                          sink_capacity=args.sink_capacity,
                          admin_token=token, poll_interval_s=args.poll_interval, record_outputs=args.record_outputs,
                          limits=Limits(**given), record_keep_bytes=args.record_keep_bytes, **shadow_bytes)
    check_config(config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    admin_port = args.admin_port if args.admin_port is not None else args.port + 1
    coroutine = run_router(_open(args), config, host=args.host, port=args.port, admin_host=args.admin_host,
                           admin_port=admin_port)
    _run_until_signal(coroutine)
    return 0


def _records_signer(args: argparse.Namespace) -> RecordSigner | None:
    """The router's record-signing key, loaded before listening (a bad key stops the start)."""
    if args.records_key is None:
        return None
    if not args.records_sink:
        raise RevgateError("--records-key signs record objects, and no --records-sink is given", where="--records-key",
                           fix="Give --records-sink too, or leave out --records-key.")
    from revgate.registry.record_signing import load_signer

    return load_signer(args.records_key)


def _router_key(args: argparse.Namespace) -> int:
    from revgate.registry.record_signing import RecordKeyInvalid, new_key_pair

    public_file = args.key_file.with_name(args.key_file.name + ".pub")
    if public_file.exists():
        raise RecordKeyInvalid("a file is already there", where=str(public_file),
                               fix="Name a new key file: an existing key is never overwritten.")
    public = new_key_pair(args.key_file).public_pem()
    public_file.write_bytes(public)
    print(f"private key: {args.key_file} (give it to `revgate router --records-key`; keep it on the router)")
    print(f"public key: {public_file}; name it in the site configuration's routes.ROUTE.record_signers under "
          "this router's --router-id:")
    print(public.decode().rstrip("\n"))
    return 0


_LIMIT_FLAGS = {  # Limits field: argparse destination
    "max_body_bytes": "max_body_bytes", "max_header_bytes": "max_header_bytes", "max_headers": "max_headers",
    "max_url_bytes": "max_url_bytes", "header_timeout_s": "header_timeout", "body_timeout_s": "body_timeout",
    "idle_timeout_s": "idle_timeout", "max_pipelined": "max_pipelined",
    "write_stall_timeout_s": "write_stall_timeout", "max_buffered_response_bytes": "max_buffered_response_bytes",
    "max_connections": "max_connections", "max_buffered_bytes": "max_buffered_bytes",
    "max_record_bytes": "max_record_bytes",
}


def _run_until_signal(coroutine: Any) -> None:
    """Run on uvloop; SIGTERM and SIGINT end the router cleanly (records flushed)."""
    import uvloop  # only the router needs it

    async def main() -> None:
        task = asyncio.ensure_future(coroutine)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    uvloop.run(main())
