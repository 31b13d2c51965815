"""Canonical JSON and content digests.

Canonical form: UTF-8, keys sorted, no insignificant whitespace, no floats. Floats are refused
because their textual form is ambiguous across languages; documents carry fractions as decimal
strings ("0.90") or integers in fixed units instead.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from manifests.errors import ManifestInvalid

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
