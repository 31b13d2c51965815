"""Declarative, versioned, hashable documents; imports nothing else of revgate."""

from manifests.artifact import ArtifactManifest, ManifestEntry, Role
from manifests.canonical import canonical_json, digest_of, sha256_digest
from manifests.document import Document
from manifests.errors import ManifestInvalid, RevgateError
from manifests.revision import ExecutionConfig, InterfacePolicy, RuntimeEnvironment, ServiceRevision

__all__ = [
    "ArtifactManifest",
    "Document",
    "ExecutionConfig",
    "InterfacePolicy",
    "ManifestEntry",
    "ManifestInvalid",
    "RevgateError",
    "Role",
    "RuntimeEnvironment",
    "ServiceRevision",
    "canonical_json",
    "digest_of",
    "sha256_digest",
]
