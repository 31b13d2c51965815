"""Reading just enough of OpenAI-shaped bodies for records, without a JSON parse on the hot path."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

import orjson

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_FINISH_REASON = re.compile(rb'"finish_reason"\s*:\s*"([a-z_]+)"')
_TEXT_PIECE = re.compile(rb'"(?:text|content)"\s*:\s*"(?:[^"\\]|\\.)+"')
_INT_VALUE = re.compile(rb'\s*:\s*(\d+)')
_WORD_VALUE = re.compile(rb'\s*:\s*"([a-z_]+)"')


class Usage(NamedTuple):
    """Token counts and finish reason found in a response body (None where absent)."""

    prompt_tokens: int | None
    output_tokens: int | None
    finish_reason: str | None


def _last(body: bytes, key: bytes, value: re.Pattern[bytes], pattern: re.Pattern[bytes]) -> bytes | None:
    """The group of the last match of ``pattern`` (``key``, then ``value``), looked for from the end, where the
    usage block and the last finish reason sit: one search back instead of a scan of the whole answer."""
    at = body.rfind(key)
    if at < 0:
        return None
    found = value.match(body, at + len(key))
    if found is not None:
        return found.group(1)
    matches = pattern.findall(body)  # the last key has no value of that shape: an earlier one may
    return matches[-1] if matches else None


def usage_of(body: bytes, streamed: bool) -> Usage:
    """Counts from the ``usage`` block; for a stream without one, the number of non-empty text deltas."""
    finish = _last(body, b'"finish_reason"', _WORD_VALUE, _FINISH_REASON)
    output = _last(body, b'"completion_tokens"', _INT_VALUE, _COMPLETION_TOKENS)
    prompt = _last(body, b'"prompt_tokens"', _INT_VALUE, _PROMPT_TOKENS)
    if output is None and streamed:
        pieces: int | None = len(_TEXT_PIECE.findall(body))
    else:
        pieces = None if output is None else int(output)
    return Usage(None if prompt is None else int(prompt), pieces, None if finish is None else finish.decode())


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


UNREADABLE = object()  # what parse_body gives for a body that is not JSON


# A run of 19 digits may be an integer orjson would read past 64 bits (as a float: a changed number).
# Found by mapping digits to "0" and the rest to " ": a translate and a substring search, ten times
# faster than a regular expression over a large body.
_DIGITS_ONLY = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
_LONG_RUN = b"0" * 19


def parse_body(body: bytes) -> Any:
    """The request body's JSON document, parsed once per request (orjson; the standard library for
    what orjson refuses or would change, such as integers past 64 bits); UNREADABLE if it is not JSON."""
    try:
        if _LONG_RUN not in body.translate(_DIGITS_ONLY):
            return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return UNREADABLE


def rewrite_model(body: bytes, served_model: str | None, document: Any = None, *, changed: bool = False) -> bytes:
    """The body the upstream gets: the request's top-level ``model`` replaced with the name it serves.

    ``document`` is the body already parsed (:func:`parse_body`), so the body is read once per request;
    ``changed`` says the document was edited in place (evidence metadata dropped) and must be written
    again even where its model stays.
    """
    request = parse_body(body) if document is None else document
    if not isinstance(request, dict):
        return body  # a malformed body goes as it came: the upstream answers it with its own 400
    if served_model is None or request.get("model") == served_model:
        if not changed:
            return body
    else:
        request["model"] = served_model
    try:
        return orjson.dumps(request)
    except (TypeError, orjson.JSONEncodeError):  # integers past 64 bits, lone surrogates: escaped ASCII JSON
        return json.dumps(request, separators=(",", ":")).encode()


def upstream_body(body: bytes, document: Any, changed: bool, *, path: bytes, served_model: str | None,
                  max_output_tokens: int | None) -> tuple[bytes, bool]:
    """The body an upstream serving ``served_model`` with that output cap gets, from the request's ``body`` and its
    parsed ``document`` (``changed``: edited already, evidence metadata dropped); and whether the document now
    differs from what the caller sent. Never parses again: stable, a fallback and the shadow each get theirs
    from the one parse at entry."""
    if max_output_tokens is not None and path != b"/v1/models":
        changed |= cap_output_tokens(document, max_output_tokens, chat=path == b"/v1/chat/completions")
    if body and (changed or served_model is not None):
        body = rewrite_model(body, served_model, document, changed=changed)
    return body, changed


def drop_evidence_metadata(document: Any) -> bool:
    """Remove the ``revgate_*`` entries of the body's ``metadata`` (labels for the router, never the engine's).

    True when something was removed: the body must then be written again.
    """
    metadata = document.get("metadata") if isinstance(document, dict) else None
    if not isinstance(metadata, dict):
        return False
    ours = [key for key in metadata if isinstance(key, str) and key.startswith("revgate_")]
    for key in ours:
        del metadata[key]
    if ours and not metadata:
        del document["metadata"]
    return bool(ours)


_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")


def cap_output_tokens(document: Any, cap: int, *, chat: bool) -> bool:
    """Hold the request to the revision's ``max_output_tokens``: a larger ask is lowered to ``cap``, and a
    chat request that names no limit (which an engine reads as "up to the context") gets ``cap``.

    True when the document changed (the body must then be written again). A completion without
    ``max_tokens`` is left alone: the API's default there is 16 tokens.
    """
    if not isinstance(document, dict):
        return False
    changed = False
    for name in _TOKEN_FIELDS:
        value = document.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            document[name] = cap
            changed = True
    if chat and not any(document.get(name) is not None for name in _TOKEN_FIELDS):
        document["max_tokens"] = cap
        changed = True
    return changed
