"""Keys and certificate chains generated for tests with `cryptography` (nothing committed)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class KeyPair:
    """PEM files of one EC key."""

    private: Path
    public: Path


@dataclass(frozen=True)
class Chain:
    """A root CA, an intermediate CA and a code-signing leaf (with its key)."""

    root: Path
    intermediate: Path
    leaf: Path
    leaf_key: Path


def write_key(
    folder: Path, name: str, curve: ec.EllipticCurve | None = None
) -> tuple[KeyPair, ec.EllipticCurvePrivateKey]:
    """A new EC private key and its public key as PEM files."""
    key = ec.generate_private_key(curve or ec.SECP256R1())
    folder.mkdir(parents=True, exist_ok=True)
    private = folder / f"{name}.pem"
    public = folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return KeyPair(private, public), key


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
                 issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=not ca, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                                     encipher_only=False, decipher_only=False), critical=True)
    )
    if not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(path: Path, certificate: x509.Certificate) -> Path:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


def write_chain(folder: Path, name: str) -> Chain:
    """Root -> intermediate -> leaf, each as a PEM file, plus the leaf's private key."""
    folder.mkdir(parents=True, exist_ok=True)
    root_key = ec.generate_private_key(ec.SECP384R1())
    root = _certificate(f"{name} root CA", root_key, None, root_key, ca=True)
    middle_key = ec.generate_private_key(ec.SECP384R1())
    middle = _certificate(f"{name} intermediate CA", middle_key, root, root_key, ca=True)
    leaf_pair, leaf_key = write_key(folder, f"{name}-leaf")
    leaf = _certificate(f"{name} release signer", leaf_key, middle, middle_key, ca=False)
    return Chain(root=_pem(folder / f"{name}-root.pem", root),
                 intermediate=_pem(folder / f"{name}-intermediate.pem", middle),
                 leaf=_pem(folder / f"{name}-leaf.crt", leaf), leaf_key=leaf_pair.private)
