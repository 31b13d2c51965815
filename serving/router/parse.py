"""Reading just enough of OpenAI-shaped bodies for records, without a JSON parse on the hot path."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_FINISH_REASON = re.compile(rb'"finish_reason"\s*:\s*"([a-z_]+)"')
_TEXT_PIECE = re.compile(rb'"(?:text|content)"\s*:\s*"(?:[^"\\]|\\.)+"')


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts and finish reason found in a response body (None where absent)."""

    prompt_tokens: int | None
    output_tokens: int | None
    finish_reason: str | None


def _last_int(pattern: re.Pattern[bytes], body: bytes) -> int | None:
    found = pattern.findall(body)
    return int(found[-1]) if found else None


def usage_of(body: bytes, streamed: bool) -> Usage:
    """Counts from the ``usage`` block; for a stream without one, the number of non-empty text deltas."""
    finish = _FINISH_REASON.findall(body)
    output = _last_int(_COMPLETION_TOKENS, body)
    if output is None and streamed:
        output = len(_TEXT_PIECE.findall(body))
    return Usage(_last_int(_PROMPT_TOKENS, body), output, finish[-1].decode() if finish else None)


def output_text(body: bytes, streamed: bool) -> str | None:
    """The generated text of the first choice (joined deltas for a stream); None if unreadable."""
    try:
        if not streamed:
            return _choice_text(json.loads(body))
        pieces = []
        for line in body.split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                pieces.append(_choice_text(json.loads(line[5:])) or "")
        return "".join(pieces)
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        return None


def _choice_text(document: Any) -> str | None:
    choices = document.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    if "text" in choice:
        return str(choice["text"] or "")
    message = choice.get("message") or choice.get("delta") or {}
    return str(message.get("content") or "")


def rewrite_model(body: bytes, served_model: str) -> bytes:
    """Replace the request's top-level ``model`` with the name the upstream serves."""
    try:
        request = json.loads(body)
    except ValueError:
        return body  # the upstream answers a malformed body with its own 400
    if not isinstance(request, dict) or request.get("model") == served_model:
        return body
    request["model"] = served_model
    return json.dumps(request, separators=(",", ":"), ensure_ascii=False).encode()
