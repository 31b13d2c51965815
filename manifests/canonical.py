"""Canonical JSON and content digests.

Canonical form: UTF-8, keys sorted, no insignificant whitespace, no floats. Floats are refused
because their textual form is ambiguous across languages; documents carry fractions as decimal
strings ("0.90") or integers in fixed units instead.
"""

from __future__ import annotations

import hashlib
import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from revgate.manifests.errors import ManifestInvalid

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def _refuse_floats(value: Any, where: str) -> None:
    if isinstance(value, float):
        raise ManifestInvalid(
            "floating-point number in a canonical document",
            where=where or "<root>",
            fix="Write fractions as decimal strings (\"0.90\") or integers in fixed units.",
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_floats(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _refuse_floats(item, f"{where}[{index}]")


def canonical_json(value: Any) -> bytes:
    """Serialise JSON-compatible data in canonical form (sorted keys, compact, no floats)."""
    _refuse_floats(value, "")
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def sha256_digest(data: bytes) -> str:
    """The ``sha256:<hex>`` digest of raw bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """The digest of the canonical JSON of ``value``."""
    return sha256_digest(canonical_json(value))


def decimal_from_text(value: object) -> object:
    """A field validator's input as a normalised Decimal: "0.05" and "0.050" are one identity.

    Strict mode refuses strings for Decimal, yet fractions travel as decimal strings; a float would
    carry binary noise into the digest, and NaN or Infinity compare as nothing.
    """
    if isinstance(value, float):
        raise ValueError('write fractions as decimal strings ("0.05"), not floats')
    if not isinstance(value, (str, Decimal)):
        return value
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a decimal number") from None
    if not number.is_finite():
        raise ValueError("must be a finite decimal number")
    return number.normalize()
