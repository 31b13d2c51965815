"""Declarative, versioned, hashable documents; imports nothing else of revgate."""

from revgate.manifests.artifact import ArtifactManifest, ManifestEntry, Role
from revgate.manifests.canonical import canonical_json, digest_of, sha256_digest
from revgate.manifests.document import Document
from revgate.manifests.errors import ManifestInvalid, RevgateError
from revgate.manifests.revision import ExecutionConfig, InterfacePolicy, RuntimeEnvironment, ServiceRevision

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
