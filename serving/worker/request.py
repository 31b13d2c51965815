"""The start request a worker receives: "run revision R", pinned, with how to verify and warm it."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from revgate.manifests.document import API_VERSION, Document
from revgate.manifests.revision import ServiceRevision
from revgate.manifests.worker import WarmProfile


class SignaturePolicySpec(Document):
    """Who must have signed the artifact, as data: a public key, a CA chain, or a keyless identity.

    Key and certificate paths name files on the worker host (trust anchors are provisioned per
    host, never shipped with the request).
    """

    kind: Literal["key", "certificate", "identity"]
    public_key: str | None = None
    chain: tuple[str, ...] = ()
    identity: str | None = None
    issuer: str | None = None

    @model_validator(mode="after")
    def _fields_for_kind(self) -> SignaturePolicySpec:
        needed = {"key": self.public_key, "certificate": self.chain, "identity": self.identity and self.issuer}
        if not needed[self.kind]:
            wanted = {"key": "public_key", "certificate": "chain", "identity": "identity and issuer"}[self.kind]
            raise ValueError(f"a {self.kind} policy needs {wanted}")
        return self


class ReplicaRequest(Document):
    """Start one replica of ``revision``: its artifact comes from ``store`` by the pinned manifest digest.

    ``signature_policy`` is the registry's policy document (who must have signed the artifact);
    the worker refuses to load anything that does not verify against it.
    """

    kind: Literal["ReplicaRequest"] = "ReplicaRequest"
    api_version: Literal["revgate/v1"] = API_VERSION
    revision: ServiceRevision
    store: str
    signature_policy: SignaturePolicySpec
    warm: WarmProfile = WarmProfile()

    @field_validator("store")
    @classmethod
    def _store_named(cls, store: str) -> str:
        if not store.strip():
            raise ValueError("store must name an artifact store URL (a path or s3://bucket/prefix)")
        return store

    @property
    def manifest_digest(self) -> str:
        """The pinned artifact manifest digest: the only identity the worker fetches and loads."""
        return self.revision.artifact.digest
