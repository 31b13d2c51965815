"""A real keyless Sigstore bundle from a public project verifies offline through an identity policy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from revgate.manifests.artifact import ArtifactManifest
from revgate.registry.build import build_manifest
from revgate.registry.errors import DigestMismatch, SignatureInvalid, UntrustedSigner
from revgate.registry.signing import IdentityPolicy, read_signed_files
from revgate.registry.verify import verify_artifact, verify_signed_folder

DATA = Path(__file__).resolve().parents[1] / "data" / "keyless-model"
SIGNATURE = DATA / "model.sig"
IDENTITY = "stefanb@us.ibm.com"
ISSUER = "https://sigstore.verify.ibm.com/oauth2"


def test_public_bundle_verifies_offline_with_its_identity() -> None:
    signed = read_signed_files(SIGNATURE, IdentityPolicy(IDENTITY, ISSUER))
    assert sorted(signed.files) == ["signme-1", "signme-2"]
    assert IDENTITY in signed.signer
    assert verify_signed_folder(DATA / "model", SIGNATURE, IdentityPolicy(IDENTITY, ISSUER))


def test_pinned_manifest_verifies_against_the_keyless_signature() -> None:
    manifest: ArtifactManifest = build_manifest(DATA / "model")
    verified = verify_artifact(DATA / "model", manifest, SIGNATURE, IdentityPolicy(IDENTITY, ISSUER))
    assert verified.digest == manifest.digest


@pytest.mark.parametrize(
    ("identity", "issuer"),
    [("someone@example.com", ISSUER), (IDENTITY, "https://accounts.google.com"), (IDENTITY.upper(), ISSUER)],
)
def test_wrong_identity_or_issuer_is_untrusted(identity: str, issuer: str) -> None:
    with pytest.raises(UntrustedSigner, match="not trusted"):
        read_signed_files(SIGNATURE, IdentityPolicy(identity, issuer))


def test_edited_keyless_bundle_does_not_verify(tmp_path: Path) -> None:
    edited = tmp_path / "model.sig"
    text = SIGNATURE.read_text()
    edited.write_text(text.replace('"sig":"MEUCIBjO', '"sig":"MEUCIBjP'))
    with pytest.raises(SignatureInvalid):
        read_signed_files(edited, IdentityPolicy(IDENTITY, ISSUER))


def test_altered_file_fails_after_a_valid_keyless_signature(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(DATA / "model", model)
    (model / "signme-2").write_bytes(b"signme-3")
    with pytest.raises(DigestMismatch, match="signme-2"):
        verify_signed_folder(model, SIGNATURE, IdentityPolicy(IDENTITY, ISSUER))
