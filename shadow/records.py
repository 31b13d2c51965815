"""Paired comparison records: the caller's answer from stable and the shadow's answer to the same request."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PairedRecord:
    """One mirrored request: both outputs and latencies, for the shadow-stage quality and SLO gates."""

    request_id: str
    route: str
    generation: int
    path: str
    stable_revision: str
    shadow_revision: str
    stable_status: int
    stable_output: str | None
    stable_ttft_s: float | None
    stable_e2e_s: float | None
    shadow_status: int | None
    shadow_output: str | None
    shadow_ttft_s: float | None
    shadow_e2e_s: float | None
    shadow_error: str = ""
    tenant: str = ""
    shadow_prompt_tokens: int | None = None
    shadow_output_tokens: int | None = None
    caller_request_id: str = ""  # the caller's own x-request-id (request_id is the router's)
    shadow_finish_reason: str | None = None  # "length" = truncated; None when the answer did not say
    prompt: str | None = None  # what the caller asked, for label-free graders that read it (a judge)

    def to_json(self) -> str:
        """One JSON line (no trailing newline)."""
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> PairedRecord:
        """Parse one line written by :meth:`to_json`."""
        data: dict[str, Any] = json.loads(line)
        return cls(**data)


def prompt_text(body: bytes) -> str | None:
    """What an OpenAI request asks, as one text: a completion's prompt, or a chat's messages in order.

    None when the body is not such a request; a judge then sees an empty request and cannot prefer.
    """
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    prompt = document.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(part, str) for part in prompt):
        return "\n".join(prompt)
    messages = document.get("messages")
    if not isinstance(messages, list):
        return None
    return "\n".join(f"{m.get('role', '')}: {_content(m.get('content'))}" for m in messages if isinstance(m, dict))


def _content(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
