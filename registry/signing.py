"""Signing and signature checking in the OpenSSF model-signing format (model_signing 1.1.1).

A signature is a Sigstore bundle whose DSSE envelope carries an in-toto statement listing every
file's sha256. This module turns a signature into the list of signed files, after checking the
signature and the signer against a trust policy; it never reads model bytes. model_signing raises
bare ``ValueError`` for most failures: they are wrapped here so a caller can tell an untrusted
signer from a broken signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from model_signing import manifest as ms_manifest
from model_signing._hashing import hashing as ms_hashing
from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore, sign_sigstore_pb
from model_signing._signing import signing as ms_signing
from model_signing._signing.sign_ec_key import get_ec_key_hash
from model_signing._signing.sign_sigstore_pb import _BUNDLE_MEDIA_TYPE, pae
from model_signing._signing.signing import _IN_TOTO_JSON_PAYLOAD_TYPE
from OpenSSL import crypto
from sigstore import errors as sigstore_errors
from sigstore import models as sigstore_models
from sigstore import verify as sigstore_verify

from revgate.manifests.artifact import ArtifactManifest
from revgate.manifests.paths import path_problem
from revgate.registry.durable import replace_file
from revgate.registry.errors import SignatureInvalid, SigningError, UnsafePath, UntrustedSigner


@dataclass(frozen=True)
class KeyPolicy:
    """Trust signatures made by the private half of this PEM public key (EC P-256/384/521)."""

    public_key: Path

    def describe(self) -> str:
        """Human-readable signer the policy accepts."""
        return f"public key {self.public_key.name}"


@dataclass(frozen=True)
class CertificatePolicy:
    """Trust signatures whose signing certificate chains to these PEM CA certificates."""

    chain: tuple[Path, ...]

    def describe(self) -> str:
        """Human-readable signer the policy accepts."""
        return "certificate chain " + ", ".join(path.name for path in self.chain)


@dataclass(frozen=True)
class IdentityPolicy:
    """Trust keyless Sigstore signatures by this identity (subject) from this OIDC issuer.

    Checked offline against the Sigstore production trust root bundled with sigstore.
    """

    identity: str
    issuer: str

    def describe(self) -> str:
        """Human-readable signer the policy accepts."""
        return f"identity {self.identity} from {self.issuer}"


Policy = KeyPolicy | CertificatePolicy | IdentityPolicy


@dataclass(frozen=True)
class SignedFiles:
    """What a verified signature vouches for: relative path -> sha256 hex, and who signed."""

    files: Mapping[str, str]
    signer: str


# ---------------------------------------------------------------------------------------------
# Signing


# model_signing names the one file of a single-file model "." (its path relative to itself).
SINGLE_FILE = "."


def _model_signing_manifest(manifest: ArtifactManifest, model_name: str, single_file: bool) -> Any:
    serialization = ms_manifest.SerializationType.from_args(
        {"method": "files", "hash_type": "sha256", "allow_symlinks": False}
    )
    if single_file and len(manifest.entries) != 1:
        raise SigningError(f"a single-file signature covers one file, the manifest pins {len(manifest.entries)}",
                           where="manifest.entries", fix="Sign the artifact's folder instead.")
    items = [
        ms_manifest.FileManifestItem(
            path=PurePosixPath(SINGLE_FILE if single_file else entry.path),
            digest=ms_hashing.Digest("sha256", bytes.fromhex(entry.sha256)),
        )
        for entry in manifest.entries
    ]
    return ms_manifest.Manifest(model_name, items, serialization)


def _sign(manifest: ArtifactManifest, output: Path, signer: Any, model_name: str, single_file: bool) -> None:
    payload = ms_signing.Payload(_model_signing_manifest(manifest, model_name, single_file))
    bundle = signer.sign(payload).bundle
    output.parent.mkdir(parents=True, exist_ok=True)
    replace_file(output, bundle.to_json().encode("utf-8"))


def _load_signer(factory: Any, *args: Any) -> Any:
    try:
        return factory(*args)
    except (ValueError, TypeError, OSError) as error:
        raise SigningError(
            f"cannot load the signing key or certificate ({error})",
            where=", ".join(str(arg) for arg in args if isinstance(arg, Path)),
            fix="Use a PEM EC private key (P-256, P-384 or P-521) and a certificate issued for it.",
        ) from None


def sign_with_key(
    manifest: ArtifactManifest, output: Path, private_key: Path, *, password: str | None = None,
    model_name: str = "model", single_file: bool = False,
) -> None:
    """Sign the manifest's files with an EC private key; writes a Sigstore bundle to ``output``.

    ``single_file`` signs a one-file artifact the way model_signing signs a file given on its own.
    """
    _sign(manifest, output, _load_signer(sign_ec_key.Signer, private_key, password), model_name, single_file)


def sign_with_certificate(
    manifest: ArtifactManifest, output: Path, private_key: Path, certificate: Path, chain: Iterable[Path],
    *, model_name: str = "model", single_file: bool = False,
) -> None:
    """Sign with a private key and its certificate; the chain is embedded for the verifier."""
    signer = _load_signer(sign_certificate.Signer, private_key, certificate, list(chain))
    _sign(manifest, output, signer, model_name, single_file)


def sign_keyless(manifest: ArtifactManifest, output: Path, *, identity_token: str, model_name: str = "model",
                 single_file: bool = False) -> None:
    """Sign keyless with Sigstore's public instance (needs the network and an OIDC token)."""
    signer = sign_sigstore.Signer(identity_token=identity_token, use_ambient_credentials=False)
    _sign(manifest, output, signer, model_name, single_file)


# ---------------------------------------------------------------------------------------------
# Verification of the signature and the signer (no model bytes are read here)


def _invalid(where: Path, reason: str) -> SignatureInvalid:
    return SignatureInvalid(
        f"signature does not verify: {reason}",
        where=str(where),
        fix="The signature is truncated, edited or not a model signature; obtain the original signature file.",
    )


def _untrusted(where: Path, reason: str, policy: Policy) -> UntrustedSigner:
    return UntrustedSigner(
        f"signer is not trusted by the policy ({policy.describe()}): {reason}",
        where=str(where),
        fix="Check that the right key, CA chain or identity was given; never widen trust to make this pass.",
    )


def _read_bundle(signature: Path, keyless: bool) -> Any:
    reader = sign_sigstore.Signature if keyless else sign_sigstore_pb.Signature
    try:
        return reader.read(signature)
    except FileNotFoundError:
        raise SignatureInvalid("signature file not found", where=str(signature),
                               fix="Pass the signature path.") from None
    except Exception as error:  # parsers raise many types; all mean malformed
        raise _invalid(signature, f"malformed bundle ({type(error).__name__}: {error})") from None


def _public_key_hint(public_key: Path) -> str:
    try:
        key = serialization.load_pem_public_key(public_key.read_bytes())
    except (ValueError, OSError) as error:
        raise SigningError(f"cannot read the public key ({error})", where=str(public_key),
                           fix="Pass a PEM EC public key.") from None
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _check_key_hint(signature: Any, policy: KeyPolicy, where: Path) -> None:
    hint = signature.bundle.verification_material.public_key.hint
    if hint and hint != _public_key_hint(policy.public_key):
        raise _untrusted(where, "the signature names a different public key", policy)


def _key_verifier(policy: KeyPolicy) -> Any:
    try:
        return sign_ec_key.Verifier(policy.public_key)
    except (ValueError, OSError) as error:
        raise SigningError(f"unusable public key ({error})", where=str(policy.public_key),
                           fix="Pass a PEM EC public key (P-256, P-384 or P-521).") from None


def _certificate_verifier(policy: CertificatePolicy) -> Any:
    if not policy.chain:
        # model_signing would fall back to the system CA bundle; trust must be explicit here.
        raise SigningError("no CA certificate given", where="--chain", fix="Pass the CA chain PEM files.")
    try:
        return sign_certificate.Verifier(list(policy.chain))
    except (ValueError, OSError) as error:
        raise SigningError(f"unusable CA chain ({error})", where=", ".join(map(str, policy.chain)),
                           fix="Pass PEM CA certificates.") from None


class _OfflineSigstoreVerifier(ms_signing.Verifier):  # type: ignore[misc]
    """model_signing's Sigstore verifier on the trust root bundled with sigstore: no network."""

    def __init__(self, identity: Any) -> None:
        trust = sigstore_models.ClientTrustConfig.production(offline=True)
        self._verifier = sigstore_verify.Verifier(trusted_root=trust.trusted_root)
        self._identity = identity

    def _verify_signed_content(self, signed: Any) -> tuple[str, bytes]:
        result: tuple[str, bytes] = self._verifier.verify_dsse(bundle=signed.bundle, policy=self._identity)
        return result


def _identity_verifier(policy: IdentityPolicy, signature: Any, where: Path) -> Any:
    identity = sigstore_verify.policy.Identity(identity=policy.identity, issuer=policy.issuer)
    try:
        identity.verify(signature.bundle.signing_certificate)
    except sigstore_errors.VerificationError as error:
        raise _untrusted(where, str(error), policy) from None

    return _OfflineSigstoreVerifier(identity)


def _verifier_for(policy: Policy, signature: Any, where: Path) -> Any:
    if isinstance(policy, KeyPolicy):
        verifier = _key_verifier(policy)
        _check_key_hint(signature, policy, where)
        return verifier
    if isinstance(policy, CertificatePolicy):
        return _certificate_verifier(policy)
    return _identity_verifier(policy, signature, where)


def _verified_manifest(verifier: Any, signature: Any, where: Path, policy: Policy) -> Any:
    try:
        return verifier.verify(signature)
    except crypto.X509StoreContextError as error:
        raise _untrusted(where, f"certificate does not chain to the trusted CA ({error})", policy) from None
    except Exception as error:  # crypto, JSON, payload errors: all do not verify
        raise _invalid(where, f"{type(error).__name__}: {error}") from None


def _signed_paths(signed: Any, where: Path) -> dict[str, str]:
    method = signed.serialization_type
    if method.get("method") != "files" or method.get("hash_type") != "sha256":
        raise _invalid(where, f"unsupported serialization {method}; re-sign with sha256 per file")
    descriptors = list(signed.resource_descriptors())
    if [descriptor.identifier for descriptor in descriptors] == [SINGLE_FILE]:
        return {SINGLE_FILE: descriptors[0].digest.digest_hex}  # a single-file model
    files: dict[str, str] = {}
    for descriptor in descriptors:
        problem = path_problem(descriptor.identifier)
        if problem:
            raise UnsafePath(f"signature lists an unsafe path: {problem}", where=descriptor.identifier,
                             fix="Refuse this signature; it tries to reach outside the artifact folder.")
        files[descriptor.identifier] = descriptor.digest.digest_hex
    return files


def read_signed_files(signature: Path, policy: Policy) -> SignedFiles:
    """Verify ``signature`` against ``policy`` and return the files and digests it vouches for.

    Raises SignatureInvalid (malformed, truncated, edited), UntrustedSigner (wrong key, CA or
    identity), or UnsafePath (a signed path escaping the folder).
    """
    bundle = _read_bundle(signature, keyless=isinstance(policy, IdentityPolicy))
    verifier = _verifier_for(policy, bundle, signature)
    files = _signed_paths(_verified_manifest(verifier, bundle, signature, policy), signature)
    return SignedFiles(files=files, signer=policy.describe())


# ---------------------------------------------------------------------------------------------
# Signed approvals: a release manager's approval statement, signed like a one-file model


APPROVAL_FILE = "approval.json"  # the one file of the signed folder: the statement's canonical JSON


@dataclass(frozen=True)
class ApprovalSignature:
    """A verified approval signature: the key that made it."""

    fingerprint: str  # sha256 of the signer's PEM public key (SubjectPublicKeyInfo), as bundles name it
    public_key_pem: str


def _statement_manifest(statement: bytes) -> ArtifactManifest:
    return ArtifactManifest.build(entries=[{"path": APPROVAL_FILE, "size": len(statement),
                                            "sha256": hashlib.sha256(statement).hexdigest(), "role": "other"}])


def sign_approval(statement: bytes, private_key: Path, *, password: str | None = None) -> str:
    """Sign an approval statement with an EC private key; the Sigstore bundle (JSON) of a folder whose one
    file, ``approval.json``, holds ``statement``. SigningError when the key cannot be read."""
    with tempfile.TemporaryDirectory(prefix="revgate-approval-") as folder:
        output = Path(folder) / "approval.sig"
        sign_with_key(_statement_manifest(statement), output, private_key, password=password,
                      model_name="revgate-approval")
        return output.read_text(encoding="utf-8")


def public_key_pem(key: str, *, base: Path | None = None) -> str:
    """The PEM text of a public key given as PEM text or as a PEM file (relative to ``base``)."""
    if key.lstrip().startswith("-----BEGIN"):
        return key
    path = Path(key) if base is None or Path(key).is_absolute() else base / key
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise SigningError(f"cannot read the approver's public key ({error})", where=str(path),
                           fix="Give a readable PEM public key file in the rollout plan's approver_keys.") from None


def key_fingerprint(pem: str) -> str:
    """``sha256:HEX`` of a PEM public key, the hint a key signature's bundle names its key by."""
    with tempfile.TemporaryDirectory(prefix="revgate-key-") as folder:
        path = Path(folder) / "key.pub"
        path.write_text(pem, encoding="utf-8")
        return "sha256:" + _public_key_hint(path)


def signature_key_hint(bundle: str) -> str:
    """The key a bundle says it was made with (``sha256:HEX``), unverified; empty when it names none."""
    try:
        hint = json.loads(bundle)["verificationMaterial"]["publicKey"]["hint"]
    except (ValueError, KeyError, TypeError):
        return ""
    return f"sha256:{hint}" if isinstance(hint, str) and hint else ""


def verify_approval(statement: bytes, bundle: str, public_key: str) -> ApprovalSignature:
    """Check that ``bundle`` signs exactly ``statement`` with the private half of ``public_key`` (PEM text).

    Raises SignatureInvalid (malformed, edited, or over other bytes) or UntrustedSigner (another key).
    """
    with tempfile.TemporaryDirectory(prefix="revgate-approval-") as folder:
        key = Path(folder) / "approver.pub"
        key.write_text(public_key, encoding="utf-8")
        signature = Path(folder) / "approval.sig"
        signature.write_text(bundle, encoding="utf-8")
        signed = read_signed_files(signature, KeyPolicy(key))
        fingerprint = "sha256:" + _public_key_hint(key)
    expected = {APPROVAL_FILE: hashlib.sha256(statement).hexdigest()}
    if dict(signed.files) != expected:
        raise SignatureInvalid("the signature is over other bytes than this approval statement",
                               where=APPROVAL_FILE, fix="Sign the approval again with `revgate approve`.")
    return ApprovalSignature(fingerprint, public_key)


# ---------------------------------------------------------------------------------------------
# Release attestations: the controller's signed release decision, an in-toto statement in a DSSE envelope
#
# The same Sigstore bundle as an approval's signature (media type, the key named by the sha256 of its PEM,
# an ECDSA signature over the DSSE pre-authentication encoding), but its envelope's payload is revgate's
# own in-toto statement, not model_signing's list of files: any DSSE verifier reads it.


@dataclass(frozen=True)
class ControllerKey:
    """The controller's loaded EC private key, and the fingerprint its signatures name it by."""

    private_key: Any
    fingerprint: str  # sha256:HEX of the PEM public key, as bundles hint it
    where: str


@dataclass(frozen=True)
class VerifiedStatement:
    """What a verified attestation vouches for: the statement's bytes, signed by the key ``fingerprint``."""

    payload: bytes
    fingerprint: str


def _pem_fingerprint(public_key: Any) -> str:
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(pem).hexdigest()


def load_controller_key(path: Path, *, password: str | None = None) -> ControllerKey:
    """The controller's EC private key (P-256, P-384 or P-521) from a PEM file; SigningError when unusable."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password.encode() if password else None)
    except (OSError, ValueError, TypeError) as error:
        raise SigningError(f"cannot read the controller's signing key ({error})", where=str(path),
                           fix="Give controller_key_file a readable PEM EC private key (P-256, P-384 or P-521), "
                               "e.g. `openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 "
                               "-nocrypt`.") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in _CURVES:
        raise SigningError("the controller's signing key is not an EC key on P-256, P-384 or P-521", where=str(path),
                           fix="Make an EC key on one of those curves; approvals are signed with the same kinds.")
    return ControllerKey(key, _pem_fingerprint(key.public_key()), str(path))


_CURVES = {"secp256r1", "secp384r1", "secp521r1"}


def _ecdsa(public_key: Any) -> Any:
    return ec.ECDSA(get_ec_key_hash(public_key))


def sign_statement(payload: bytes, key: ControllerKey) -> str:
    """A Sigstore bundle (JSON) whose DSSE envelope carries the in-toto statement ``payload``, signed with ``key``."""
    signature = key.private_key.sign(pae(payload), _ecdsa(key.private_key.public_key()))
    bundle = {
        "mediaType": _BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": key.fingerprint.removeprefix("sha256:")}, "tlogEntries": []},
        "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": _IN_TOTO_JSON_PAYLOAD_TYPE,
                         "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": ""}]},
    }
    return json.dumps(bundle, indent=2, sort_keys=True)


def verify_statement(bundle: str, public_key: str, *, where: str = "release attestation") -> VerifiedStatement:
    """The in-toto statement ``bundle`` carries, once its signature verifies with ``public_key`` (PEM text).

    Raises SignatureInvalid (malformed, edited, not an in-toto envelope) or UntrustedSigner (another key).
    """
    try:
        key = serialization.load_pem_public_key(public_key.encode("utf-8"))
    except ValueError as error:
        raise SigningError(f"cannot read the controller's public key ({error})", where="--controller-key",
                           fix="Give the controller's PEM EC public key.") from None
    fingerprint = _pem_fingerprint(key)
    try:
        document = json.loads(bundle)
        envelope = document["dsseEnvelope"]
        hint = document["verificationMaterial"]["publicKey"].get("hint", "")
        payload = base64.b64decode(envelope["payload"], validate=True)
        signature = base64.b64decode(envelope["signatures"][0]["sig"], validate=True)
        payload_type = envelope["payloadType"]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, binascii.Error) as error:
        raise SignatureInvalid(f"the attestation is not a DSSE bundle ({type(error).__name__}: {error})",
                               where=where, fix="Obtain the original attestation; this one was edited.") from None
    if payload_type != _IN_TOTO_JSON_PAYLOAD_TYPE:
        raise SignatureInvalid(f"the attestation's payload type is {payload_type!r}, not an in-toto statement",
                               where=where, fix="Obtain the original attestation; this one was edited.")
    if hint and f"sha256:{hint}" != fingerprint:
        raise UntrustedSigner(f"the attestation was signed with key sha256:{hint}, not the trusted controller key "
                              f"{fingerprint}", where=where,
                              fix="Check that you gave the controller's public key; never trust a key found in "
                                  "the run.")
    try:
        key.verify(signature, pae(payload), _ecdsa(key))  # type: ignore[union-attr, call-arg]
    except (InvalidSignature, TypeError, AttributeError) as error:
        raise SignatureInvalid(f"the attestation's signature does not verify with the controller key {fingerprint} "
                               f"({type(error).__name__})", where=where,
                               fix="The statement or its signature was changed after signing; the decision is "
                                   "unproven.") from None
    return VerifiedStatement(payload, fingerprint)
