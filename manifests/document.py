"""Frozen, strict pydantic base for every hashable document."""

from __future__ import annotations

from typing import Final, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from revgate.manifests.canonical import canonical_json, digest_of
from revgate.manifests.errors import ManifestInvalid, NotCanonical
from revgate.manifests.jsonread import load_json

API_VERSION: Final = "revgate/v1"


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem: ``field.path: message``."""
    lines = []
    for problem in error.errors():
        location = ".".join(str(part) for part in problem["loc"]) or "<root>"
        lines.append(f"{location}: {problem['msg']}")
    return "; ".join(lines)


class Document(BaseModel):
    """A declarative, versioned document with a canonical form and a content digest.

    Strict and frozen: a malformed document cannot be constructed, and a constructed one
    cannot change, so its digest is stable for its lifetime.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def canonical(self) -> bytes:
        """The canonical JSON bytes of this document."""
        return canonical_json(self.model_dump(mode="json"))

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` over the canonical JSON."""
        return digest_of(self.model_dump(mode="json"))

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "") -> Self:
        """Parse and validate; a :class:`ManifestInvalid` names each bad field (a repeated key, too)."""
        where = source or "<input>"
        load_json(data, where=where)  # refuses what pydantic's parser would silently resolve
        try:
            return cls.model_validate_json(data)
        except ValidationError as error:
            raise ManifestInvalid(
                f"invalid {cls.__name__}: {describe_validation_error(error)}",
                where=where,
                fix="Correct the named fields; the document was not loaded.",
            ) from None

    @classmethod
    def from_canonical(cls, data: bytes, *, source: str = "") -> Self:
        """Parse bytes that must be this document's canonical form (what a digest or a store names)."""
        document = cls.from_json(data, source=source)
        if document.canonical() != data:
            raise NotCanonical(
                f"{cls.__name__} is not in canonical form (sorted keys, no spaces, normalised values), "
                "so its bytes and its digest would name two different things",
                where=source or "<input>",
                fix="Publish the document's canonical bytes (Document.canonical()); nothing was loaded.",
            )
        return document

    @classmethod
    def build(cls, **fields: object) -> Self:
        """Construct from Python values (lists allowed for tuples); errors as :meth:`from_json`."""
        try:
            return cls.model_validate(fields, strict=False)
        except ValidationError as error:
            raise ManifestInvalid(
                f"invalid {cls.__name__}: {describe_validation_error(error)}",
                fix="Correct the named fields.",
            ) from None
