"""Signed record objects: each router signs what it writes to the record store with its own Ed25519 key.

Format. A signed object is the router's JSON lines (the body, each line ending in ``\\n``) followed
by one last line of a shape no record has::

    {"revgate_record_signature": {"v": 1, "alg": "ed25519", "sig": "<base64 of 64 bytes>"}}

The signature is over ``revgate-records-v1 NUL <object key> NUL <body>``, where the object key is
the object's full name under the store's root, ``<route>/<kind>/<router>/<file>``. Binding the name
means an object cannot be replayed under another name, another route or kind, or in another
router's folder: its signature no longer matches. The whole object is still one PUT.

Trust. A reader given a router's public key (the site configuration's ``record_signers``) checks
every object under that router's folder before it uses any of its lines; an object without the
line, or whose signature does not match, is refused and reported with its key. A reader given no
keys reads as before and skips the signature line.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from revgate.manifests.errors import RevgateError

FIELD = "revgate_record_signature"
VERSION = 1
DOMAIN = b"revgate-records-v1\0"
_LINE_START = b'{"' + FIELD.encode() + b'"'
PEM_START = "-----BEGIN"


class RecordKeyInvalid(RevgateError):
    """A router's record-signing key (private or public) that cannot be used."""


def signed_message(key: str, body: bytes) -> bytes:
    """What a router signs: the domain, the object's key and its body."""
    return DOMAIN + key.encode("utf-8") + b"\0" + body


@dataclass(frozen=True)
class RecordSigner:
    """A router's private key: turns a batch's body into the signed object stored under ``key``."""

    private: Ed25519PrivateKey

    def sign(self, key: str, body: bytes) -> bytes:
        """The object's bytes: the body and its signature line."""
        signature = base64.b64encode(self.private.sign(signed_message(key, body))).decode()
        line = json.dumps({FIELD: {"v": VERSION, "alg": "ed25519", "sig": signature}}, separators=(",", ":"))
        return body + line.encode() + b"\n"

    def public_pem(self) -> bytes:
        """The public half, as the site configuration names it."""
        return public_pem(self.private.public_key())


def public_pem(public: Ed25519PublicKey) -> bytes:
    """A public key as PEM (SubjectPublicKeyInfo)."""
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def split_signature(data: bytes) -> tuple[bytes, bytes | None]:
    """The body and the signature line (None when the last line is not one)."""
    content = data[:-1] if data.endswith(b"\n") else data
    cut = content.rfind(b"\n") + 1
    last = content[cut:]
    if not last.startswith(_LINE_START):
        return data, None
    return data[:cut], last


def verify_object(public: Ed25519PublicKey, key: str, data: bytes) -> tuple[bytes, str]:
    """The object's body, and why it is refused ("" when the router's key signed this body under this key)."""
    body, line = split_signature(data)
    if line is None:
        return body, "no signature line: not written by this router's key"
    try:
        found = json.loads(line)[FIELD]
        if found.get("v") != VERSION or found.get("alg") != "ed25519":
            return body, f"a signature of an unknown kind ({found.get('alg')!r}, version {found.get('v')!r})"
        public.verify(base64.b64decode(found["sig"], validate=True), signed_message(key, body))
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
        return body, "a signature line that cannot be read"
    except InvalidSignature:
        return body, ("the signature does not match this router's key over this name and these bytes "
                      "(altered, renamed, or copied from another router's folder)")
    return body, ""


# --- keys ----------------------------------------------------------------------------------------


def new_key_pair(private_path: Path) -> RecordSigner:
    """Make a router's key pair: the private key written to ``private_path`` (mode 0600, never over a file)."""
    key = Ed25519PrivateKey.generate()
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    try:
        descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise RecordKeyInvalid("a file is already there", where=str(private_path),
                               fix="Name a new file: an existing key is never overwritten.") from None
    except OSError as error:
        raise RecordKeyInvalid(f"cannot write the key ({error.strerror})", where=str(private_path),
                               fix="Name a file in a writable folder.") from None
    with os.fdopen(descriptor, "wb") as stream:
        stream.write(data)
    return RecordSigner(key)


def load_signer(path: Path) -> RecordSigner:
    """A router's private key from a PEM file only its owner can read."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as error:
        raise RecordKeyInvalid(f"cannot read the record-signing key ({error.strerror})", where=str(path),
                               fix="Give the PEM file `revgate router-key` wrote.") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise RecordKeyInvalid("the record-signing key is readable by other users", where=str(path),
                               fix=f"chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise RecordKeyInvalid(f"not a PEM private key without password ({error})", where=str(path),
                               fix="Give the PEM file `revgate router-key` wrote.") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise RecordKeyInvalid("the record-signing key is not an Ed25519 key", where=str(path),
                               fix="Make one with `revgate router-key`.")
    return RecordSigner(key)


def load_public_key(given: str, where: str) -> Ed25519PublicKey:
    """A router's public key from PEM text, or from the PEM file it names."""
    if given.lstrip().startswith(PEM_START):
        data = given.encode()
    else:
        try:
            data = Path(given).read_bytes()
        except OSError as error:
            raise RecordKeyInvalid(f"cannot read the router's public key {given!r} ({error.strerror})",
                                   where=where, fix="Give PEM text or a readable PEM file.") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as error:
        raise RecordKeyInvalid(f"not a PEM public key ({error})", where=where,
                               fix="Give the public key `revgate router-key` printed.") from None
    if not isinstance(key, Ed25519PublicKey):
        raise RecordKeyInvalid("the router's public key is not an Ed25519 key", where=where,
                               fix="Give the public key `revgate router-key` printed.")
    return key


def signer_keys(signers: Mapping[str, str], where: str = "record_signers") -> dict[str, Ed25519PublicKey]:
    """Each named router's public key, from the site configuration's ``record_signers``."""
    return {router: load_public_key(given, f"{where}.{router}") for router, given in signers.items()}
