"""Typed registry errors: tampering is told apart from malformed input and from store trouble.

Every error names the file or field at fault and what to do, and is raised before anything is
loaded, published or renamed into place.
"""

from __future__ import annotations

from revgate.manifests.errors import RevgateError


class VerificationError(RevgateError):
    """The bytes on disk, the signature or the signer do not prove the pinned artifact."""


class DigestMismatch(VerificationError):
    """A file's bytes differ from its pinned sha256: the file was altered or corrupted."""

    def __init__(self, file: str, expected: str, actual: str, *, fix: str = "") -> None:
        self.file = file
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"digest mismatch: expected sha256 {expected}, found {actual}",
            where=file,
            fix=fix or "The file was altered or corrupted; fetch the artifact again from the store.",
        )


class MissingFile(VerificationError):
    """A pinned file is absent from the artifact folder."""


class UnexpectedFile(VerificationError):
    """The artifact folder holds a file that the manifest or signature does not pin."""


class UnsafePath(VerificationError):
    """A symlink, a non-regular file, or a path escaping the artifact folder."""


class SignatureInvalid(VerificationError):
    """The signature file is malformed, truncated, edited, or does not verify."""


class UntrustedSigner(VerificationError):
    """The signature verifies cryptographically but not against the trust policy (key, CA, identity)."""


class ManifestMismatch(VerificationError):
    """The signed file list and digests differ from the pinned artifact manifest."""


class StoreError(RevgateError):
    """An artifact store could not be read or written."""


class ObjectExists(StoreError):
    """A write-once object already exists with different content; it was not overwritten."""


class ObjectCorrupt(StoreError):
    """A stored object's bytes do not match its content address, and it could not be replaced."""


class ObjectMissing(StoreError):
    """A requested object is not in the store."""


class IncompatibleArtifact(RevgateError):
    """The artifact cannot run under the given execution config or interface policy."""

    def __init__(self, what: str, *, field: str, fix: str) -> None:
        self.field = field
        super().__init__(what, where=field, fix=fix)


class RuntimeUnknown(RevgateError):
    """The engine environment's identity (its lock file) cannot be read."""


class SigningError(RevgateError):
    """An artifact could not be signed (unsupported key, certificate not matching the key)."""


class ArtifactRefused(RevgateError):
    """An artifact will not be loaded: no signature published, another runtime pinned, a store mismatch."""
