"""The artifact manifest: every file that defines model behaviour, pinned by content digest."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from revgate.manifests.canonical import DIGEST, SHA256_HEX
from revgate.manifests.document import API_VERSION, Document
from revgate.manifests.paths import collision_problem, path_problem


class Role(StrEnum):
    """What a file is for; the loader and the compatibility checks read roles, not names."""

    WEIGHTS = "weights"
    CONFIG = "config"
    TOKENIZER = "tokenizer"
    CHAT_TEMPLATE = "chat_template"
    GENERATION_CONFIG = "generation_config"
    ADAPTER = "adapter"
    QUANTIZATION = "quantization"
    OTHER = "other"


class ManifestEntry(Document):
    """One file: relative path, size in bytes, sha256, role; adapters name their base artifact."""

    path: str
    size: Annotated[int, Field(ge=0)]
    sha256: str
    role: Role
    base_artifact: str | None = None

    @field_validator("path")
    @classmethod
    def _safe_path(cls, path: str) -> str:
        problem = path_problem(path)
        if problem:
            raise ValueError(f"{problem}: {path!r}")
        return path

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not SHA256_HEX.match(value):
            raise ValueError("sha256 must be 64 lowercase hex characters")
        return value

    @field_validator("role", mode="before")
    @classmethod
    def _role_from_text(cls, value: Any) -> Any:
        # Strict mode would refuse the plain string a JSON document carries.
        return Role(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _adapter_binding(self) -> ManifestEntry:
        if self.role is Role.ADAPTER:
            if self.base_artifact is None or not DIGEST.match(self.base_artifact):
                raise ValueError("an adapter entry must bind base_artifact to a sha256:<hex> artifact digest")
        elif self.base_artifact is not None:
            raise ValueError("only adapter entries may carry base_artifact")
        return self


class ArtifactManifest(Document):
    """An immutable artifact identity: the sorted set of its files' digests."""

    kind: Literal["ArtifactManifest"] = "ArtifactManifest"
    api_version: Literal["revgate/v1"] = API_VERSION
    entries: tuple[ManifestEntry, ...]

    @field_validator("entries")
    @classmethod
    def _sorted_unique(cls, entries: tuple[ManifestEntry, ...]) -> tuple[ManifestEntry, ...]:
        if not entries:
            raise ValueError("an artifact has at least one file")
        problem = collision_problem(entry.path for entry in entries)
        if problem:
            raise ValueError(problem)
        return tuple(sorted(entries, key=lambda entry: entry.path))

    @property
    def total_size(self) -> int:
        """Bytes over all files."""
        return sum(entry.size for entry in self.entries)

    def by_path(self) -> dict[str, ManifestEntry]:
        """Entries keyed by relative path."""
        return {entry.path: entry for entry in self.entries}

    def with_role(self, role: Role) -> tuple[ManifestEntry, ...]:
        """Entries with the given role, in path order."""
        return tuple(entry for entry in self.entries if entry.role is role)

    @property
    def base_artifact(self) -> str | None:
        """For an adapter artifact, the base artifact digest its adapter entries bind to."""
        bases = {entry.base_artifact for entry in self.with_role(Role.ADAPTER)}
        return bases.pop() if len(bases) == 1 else None
