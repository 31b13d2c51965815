"""The tamper matrix: every way an artifact or its signature can be wrong gives its typed error.

Real signatures (model_signing, EC keys, X.509 chains made here), real files; nothing is mocked.
verify_artifact returns nothing on failure, so nothing can be loaded from a failed check.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from revgate.manifests.artifact import ArtifactManifest
from revgate.manifests.errors import ManifestInvalid
from revgate.registry.build import build_manifest
from revgate.registry.errors import (
    DigestMismatch,
    ManifestMismatch,
    MissingFile,
    SignatureInvalid,
    UnexpectedFile,
    UnsafePath,
    UntrustedSigner,
    VerificationError,
)
from revgate.registry.signing import CertificatePolicy, KeyPolicy, sign_with_certificate, sign_with_key
from revgate.registry.verify import verify_artifact
from tests.integration.signing_material import Chain, KeyPair, write_chain, write_key


@dataclass(frozen=True)
class Signed:
    """A model folder, its pinned manifest, and a key signature over it."""

    model: Path
    manifest: ArtifactManifest
    signature: Path
    keys: KeyPair
    root: Path


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 128, "num_attention_heads": 4}')
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (folder / "model.safetensors").write_bytes(os.urandom(64 * 1024))
    (folder / "shards").mkdir()
    (folder / "shards" / "part-2.safetensors").write_bytes(os.urandom(4096))
    return folder


@pytest.fixture
def signed(tmp_path: Path) -> Signed:
    model = _model(tmp_path / "model")
    manifest = build_manifest(model)
    keys, _ = write_key(tmp_path / "keys", "release")
    signature = tmp_path / "model.sig"
    sign_with_key(manifest, signature, keys.private)
    return Signed(model, manifest, signature, keys, tmp_path)


def _verify(signed: Signed, **changes: object) -> object:
    args: dict[str, object] = {"model_dir": signed.model, "manifest": signed.manifest, "signature": signed.signature,
                               "policy": KeyPolicy(signed.keys.public)}
    args.update(changes)
    return verify_artifact(**args)  # type: ignore[arg-type]


def test_untouched_artifact_verifies(signed: Signed) -> None:
    verified = _verify(signed)
    assert verified.manifest == signed.manifest  # type: ignore[attr-defined]
    assert verified.digest == signed.manifest.digest  # type: ignore[attr-defined]


def test_byte_flipped(signed: Signed) -> None:
    path = signed.model / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[12345] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(DigestMismatch) as caught:
        _verify(signed)
    entry = signed.manifest.by_path()["model.safetensors"]
    assert (caught.value.file, caught.value.expected) == ("model.safetensors", entry.sha256)
    assert caught.value.actual != entry.sha256 and "model.safetensors" in str(caught.value)


def test_file_added(signed: Signed) -> None:
    (signed.model / "extra.py").write_text("import os")
    with pytest.raises(UnexpectedFile, match=r"extra\.py"):
        _verify(signed)


def test_file_removed(signed: Signed) -> None:
    (signed.model / "tokenizer.json").unlink()
    with pytest.raises(MissingFile, match=r"tokenizer\.json"):
        _verify(signed)


def test_file_renamed(signed: Signed) -> None:
    (signed.model / "shards" / "part-2.safetensors").rename(signed.model / "shards" / "part-3.safetensors")
    with pytest.raises(MissingFile, match=r"part-3\.safetensors: renamed\?\) at shards/part-2"):
        _verify(signed)


def test_file_replaced_by_symlink(signed: Signed) -> None:
    target = signed.root / "elsewhere.json"
    shutil.copy(signed.model / "config.json", target)  # same bytes: only the link itself is wrong
    (signed.model / "config.json").unlink()
    (signed.model / "config.json").symlink_to(target)
    with pytest.raises(UnsafePath, match="symlink"):
        _verify(signed)


def test_path_traversal_in_a_manifest_cannot_be_loaded(signed: Signed) -> None:
    document = json.loads(signed.manifest.canonical())
    document["entries"][0]["path"] = "../../etc/passwd"
    with pytest.raises(ManifestInvalid, match=r"entries\.0\.path.*escapes"):
        ArtifactManifest.from_json(json.dumps(document), source="manifest.json")


def test_path_traversal_in_a_signature_is_refused(signed: Signed) -> None:
    evil = ArtifactManifest.model_construct(entries=(signed.manifest.entries[0].model_copy(
        update={"path": "../outside.json"}),))
    sign_with_key(evil, signed.signature, signed.keys.private)
    with pytest.raises(UnsafePath, match="outside"):
        _verify(signed)


def test_wrong_key(signed: Signed) -> None:
    other, _ = write_key(signed.root / "keys", "other")
    with pytest.raises(UntrustedSigner, match="different public key"):
        _verify(signed, policy=KeyPolicy(other.public))


def test_signed_by_another_key_against_the_trusted_one(signed: Signed) -> None:
    other, _ = write_key(signed.root / "keys", "attacker")
    sign_with_key(signed.manifest, signed.signature, other.private)
    with pytest.raises(UntrustedSigner):
        _verify(signed)


def test_truncated_signature(signed: Signed) -> None:
    data = signed.signature.read_bytes()
    signed.signature.write_bytes(data[: len(data) // 2])
    with pytest.raises(SignatureInvalid, match="malformed"):
        _verify(signed)


def test_edited_signature_payload(signed: Signed) -> None:
    bundle = json.loads(signed.signature.read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "00" * 32
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    signed.signature.write_text(json.dumps(bundle))
    with pytest.raises(SignatureInvalid, match="does not verify"):
        _verify(signed)


def test_manifest_disagreeing_with_signature(signed: Signed) -> None:
    # A correctly signed, different artifact: the signature is valid, but not for this manifest.
    (signed.model / "config.json").write_text('{"hidden_size": 256}')
    other = build_manifest(signed.model)
    sign_with_key(other, signed.signature, signed.keys.private)
    with pytest.raises(ManifestMismatch, match=r"digest differs: config\.json"):
        _verify(signed)


def test_every_failure_is_a_verification_error(signed: Signed) -> None:
    (signed.model / "tokenizer.json").write_text("{}")
    with pytest.raises(VerificationError):
        _verify(signed)


@pytest.fixture
def chain(tmp_path: Path) -> Chain:
    return write_chain(tmp_path / "pki", "release")


def test_certificate_chain_verifies_and_a_foreign_ca_is_untrusted(signed: Signed, chain: Chain) -> None:
    sign_with_certificate(signed.manifest, signed.signature, chain.leaf_key, chain.leaf, [chain.intermediate])
    verified = _verify(signed, policy=CertificatePolicy((chain.root,)))
    assert verified.digest == signed.manifest.digest  # type: ignore[attr-defined]
    foreign = write_chain(signed.root / "foreign", "foreign")
    with pytest.raises(UntrustedSigner, match="does not chain"):
        _verify(signed, policy=CertificatePolicy((foreign.root,)))


def test_key_signature_is_not_accepted_as_a_certificate_signature(signed: Signed, chain: Chain) -> None:
    with pytest.raises(VerificationError):
        _verify(signed, policy=CertificatePolicy((chain.root,)))
