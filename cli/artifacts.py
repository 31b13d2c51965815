"""revgate command line: artifact manifests, signing, verification, push and pull."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from revgate.manifests.artifact import ArtifactManifest
from revgate.manifests.errors import ManifestInvalid
from revgate.registry.hashing import Progress

# Registry modules (model_signing, sigstore, boto3) are imported inside handlers: `revgate --help` stays fast.

# Below this many bytes a progress bar is noise.
PROGRESS_MIN_BYTES = 32 * 1024 * 1024


@contextmanager
def progress_bar(total: int, description: str) -> Iterator[Progress | None]:
    """A tqdm byte counter on stderr for large jobs (thread-safe updates), else None."""
    if total < PROGRESS_MIN_BYTES:
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=description, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
              disable=None) as bar:
        yield bar.update


def _load_manifest(path: Path) -> ArtifactManifest:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ManifestInvalid(f"cannot read manifest ({error.strerror})", where=str(path),
                              fix="Pass the manifest written by `revgate manifest build`.") from None
    return ArtifactManifest.from_json(data, source=str(path))


def _write_text_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)


def _outside(model_dir: Path, output: Path) -> None:
    if output.resolve().is_relative_to(model_dir.resolve()):
        raise ManifestInvalid("output file is inside the artifact folder", where=str(output),
                              fix="Write it outside the folder; inside, it would become an unpinned extra file.")


def _build(model_dir: Path, base: str | None, workers: int | None) -> ArtifactManifest:
    from revgate.registry.build import build_manifest, total_bytes

    with progress_bar(total_bytes(model_dir), "hashing") as progress:
        return build_manifest(model_dir, base_artifact=base, workers=workers, progress=progress)


def cmd_manifest_build(args: argparse.Namespace) -> int:
    """revgate manifest build DIR -o manifest.json"""
    _outside(args.dir, args.output)
    manifest = _build(args.dir, args.base, args.workers)
    _write_text_atomically(args.output, manifest.model_dump_json(indent=2) + "\n")
    print(manifest.digest)
    return 0


def _pinned_or_built(args: argparse.Namespace) -> ArtifactManifest:
    if args.manifest is None:
        return _build(args.dir, getattr(args, "base", None), args.workers)
    from revgate.registry.verify import check_tree

    manifest = _load_manifest(args.manifest)
    with progress_bar(manifest.total_size, "hashing") as progress:
        check_tree(args.dir, {entry.path: entry.sha256 for entry in manifest.entries}, workers=args.workers,
                   progress=progress)
    return manifest


def cmd_sign(args: argparse.Namespace) -> int:
    """revgate sign DIR --key KEY.pem [--cert C --chain CA] -o SIG"""
    from revgate.registry.signing import sign_with_certificate, sign_with_key

    _outside(args.dir, args.output)
    manifest = _pinned_or_built(args)
    name, single_file = args.dir.resolve().name, args.dir.is_file()
    if args.cert is not None:
        sign_with_certificate(manifest, args.output, args.key, args.cert, args.chain or [], model_name=name,
                              single_file=single_file)
    elif args.chain:
        raise ManifestInvalid("--chain needs --cert", where="--chain", fix="Pass the signing certificate with --cert.")
    else:
        sign_with_key(manifest, args.output, args.key, model_name=name, single_file=single_file)
    print(manifest.digest)
    return 0


def _policy(args: argparse.Namespace) -> Any:
    from revgate.registry.signing import CertificatePolicy, IdentityPolicy, KeyPolicy

    chosen = [bool(args.key), bool(args.chain), bool(args.identity or args.issuer)]
    if sum(chosen) != 1 or (args.identity is None) != (args.issuer is None):
        raise ManifestInvalid("choose exactly one trust policy", where="--key | --chain | --identity/--issuer",
                              fix="Pass --key PUB, or --chain CA.pem (repeatable), or --identity ID with --issuer URL.")
    if args.key:
        return KeyPolicy(args.key)
    if args.chain:
        return CertificatePolicy(tuple(args.chain))
    return IdentityPolicy(args.identity, args.issuer)


def cmd_verify(args: argparse.Namespace) -> int:
    """revgate verify DIR --signature SIG (--key PUB | --chain CA | --identity ID --issuer URL) [--manifest M]"""
    from revgate.registry.build import total_bytes
    from revgate.registry.verify import verify_artifact, verify_signed_folder

    policy = _policy(args)
    with progress_bar(total_bytes(args.dir), "verifying") as progress:
        if args.manifest is None:
            signer = verify_signed_folder(args.dir, args.signature, policy, workers=args.workers, progress=progress)
            print(f"verified: {args.dir} signed by {signer}")
            return 0
        verified = verify_artifact(args.dir, _load_manifest(args.manifest), args.signature, policy,
                                   workers=args.workers, progress=progress)
    print(f"verified: {verified.digest} signed by {verified.signer}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    """revgate push DIR STORE_URL [--signature SIG] [--manifest M]"""
    from revgate.registry.store import open_store

    manifest = _pinned_or_built(args)
    store = open_store(args.store, endpoint_url=args.endpoint_url)
    with progress_bar(manifest.total_size, "uploading") as progress:
        digest = store.push(args.dir, manifest, args.signature, progress=progress)
    print(digest)
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    """revgate pull MANIFEST_DIGEST STORE_URL DEST [--signature-out SIG]"""
    from revgate.registry.store import open_store

    store = open_store(args.store, endpoint_url=args.endpoint_url)
    manifest = store.get_manifest(args.digest)
    with progress_bar(manifest.total_size, "downloading") as progress:
        store.pull(args.digest, args.dest, progress=progress)
    signature = store.get_signature(args.digest)
    if signature is not None and args.signature_out is not None:
        args.signature_out.parent.mkdir(parents=True, exist_ok=True)
        args.signature_out.write_bytes(signature)
    print(f"pulled {args.digest} into {args.dest}")
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=None, help="hashing threads (default: one per core)")


def _register_manifest(subparsers: argparse._SubParsersAction[Any]) -> None:
    manifest = subparsers.add_parser("manifest", help="artifact manifests")
    commands = manifest.add_subparsers(dest="manifest_command", required=True)
    build = commands.add_parser("build", help="hash a model folder (or one model file) into an artifact manifest")
    build.add_argument("dir", type=Path)
    build.add_argument("-o", "--output", type=Path, required=True)
    build.add_argument("--base", help="base artifact digest that adapter files bind to")
    _common(build)
    build.set_defaults(func=cmd_manifest_build)


def _register_sign_verify(subparsers: argparse._SubParsersAction[Any]) -> None:
    sign = subparsers.add_parser("sign", help="sign a model folder or file (OpenSSF model-signing format)")
    sign.add_argument("dir", type=Path)
    sign.add_argument("--key", type=Path, required=True, help="PEM EC private key")
    sign.add_argument("--cert", type=Path, help="signing certificate for the key")
    sign.add_argument("--chain", type=Path, action="append", help="CA certificates to embed (repeatable)")
    sign.add_argument("--manifest", type=Path, help="sign this pinned manifest (the folder must match it)")
    sign.add_argument("-o", "--output", type=Path, required=True)
    _common(sign)
    sign.set_defaults(func=cmd_sign)

    verify = subparsers.add_parser("verify", help="verify a model folder or file against its signature")
    verify.add_argument("dir", type=Path)
    verify.add_argument("--signature", type=Path, required=True)
    verify.add_argument("--key", type=Path, help="PEM public key")
    verify.add_argument("--chain", type=Path, action="append", help="PEM CA certificate (repeatable)")
    verify.add_argument("--identity", help="Sigstore signer identity (e-mail or workflow URI)")
    verify.add_argument("--issuer", help="OIDC issuer URL of the identity")
    verify.add_argument("--manifest", type=Path, help="the pinned manifest the signature must equal")
    _common(verify)
    verify.set_defaults(func=cmd_verify)


def _register_transfer(subparsers: argparse._SubParsersAction[Any]) -> None:
    push = subparsers.add_parser("push", help="publish a model folder or file to a write-once artifact store")
    push.add_argument("dir", type=Path)
    push.add_argument("store", help="folder, file:///path or s3://bucket/prefix")
    push.add_argument("--signature", type=Path)
    push.add_argument("--manifest", type=Path, help="push this pinned manifest (the folder must match it)")
    push.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    _common(push)
    push.set_defaults(func=cmd_push)

    pull = subparsers.add_parser("pull", help="download and verify an artifact by manifest digest")
    pull.add_argument("digest")
    pull.add_argument("store")
    pull.add_argument("dest", type=Path)
    pull.add_argument("--signature-out", type=Path, help="where to write the published signature")
    pull.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    pull.set_defaults(func=cmd_pull)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add manifest, sign, verify, push and pull."""
    _register_manifest(subparsers)
    _register_sign_verify(subparsers)
    _register_transfer(subparsers)
