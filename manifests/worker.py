"""The warm profile: the request shapes a replica must serve before its readiness is published.

Readiness means "has served these shapes", not "the process is up". The profile is part of the
start request, so what "warm" meant for a replica is on record with it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from revgate.manifests.document import API_VERSION, Document
from revgate.manifests.errors import ManifestInvalid


class WarmProfile(Document):
    """Prompt lengths (tokens), output length, concurrency and request count of the warm-up.

    Requests cycle through ``prompt_lengths``; at most ``concurrency`` are in flight at once.
    Warm-up passes only if every request succeeds and produced output tokens.
    """

    kind: Literal["WarmProfile"] = "WarmProfile"
    api_version: Literal["revgate/v1"] = API_VERSION
    prompt_lengths: tuple[Annotated[int, Field(ge=1)], ...] = (8, 32)
    max_tokens: Annotated[int, Field(ge=1, le=4096)] = 16
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 4
    request_count: Annotated[int, Field(ge=1, le=100_000)] = 16
    timeout_ms: Annotated[int, Field(ge=1)] = 120_000

    @field_validator("prompt_lengths")
    @classmethod
    def _some_lengths(cls, lengths: tuple[int, ...]) -> tuple[int, ...]:
        if not lengths:
            raise ValueError("at least one prompt length")
        return lengths

    @model_validator(mode="after")
    def _covers_every_shape(self) -> WarmProfile:
        if self.request_count < len(self.prompt_lengths):
            raise ValueError("request_count is smaller than the number of prompt lengths: some shapes never run")
        return self

    @property
    def longest_sequence(self) -> int:
        """Prompt plus output tokens of the longest warm-up request."""
        return max(self.prompt_lengths) + self.max_tokens

    def check_fits(self, max_model_len: int, where: str = "warm profile") -> None:
        """Refuse a profile whose longest request does not fit the engine's context length."""
        if self.longest_sequence > max_model_len:
            raise ManifestInvalid(
                f"warm-up request of {self.longest_sequence} tokens exceeds max_model_len {max_model_len}",
                where=where,
                fix="Shorten prompt_lengths or max_tokens, or raise the execution config's max_model_len.",
            )

    def request_lengths(self) -> tuple[int, ...]:
        """The prompt length of each warm-up request, in order (lengths cycled)."""
        lengths = self.prompt_lengths
        return tuple(lengths[index % len(lengths)] for index in range(self.request_count))
