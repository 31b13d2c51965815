"""Reading JSON strictly: one meaning per byte string, whatever parser reads it next.

Python's parser lets the last of two equal keys win, accepts NaN and Infinity, and yields strings
holding lone surrogates that cannot be written back as UTF-8. Each is refused here with a typed
error, so a document that parses means the same to every reader and re-serialises without error.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from revgate.manifests.errors import DuplicateKey, ManifestInvalid


class _Refused(ValueError):
    """Raised from inside the parser's hooks; turned into a typed error by :func:`load_json`."""

    def __init__(self, error: ManifestInvalid) -> None:
        super().__init__(str(error))
        self.error = error


def _object(pairs: list[tuple[str, Any]], where: str) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Refused(DuplicateKey(f"duplicate JSON key {key!r}", where=where,
                                        fix="Keep one value per key; the document was not loaded."))
        result[key] = value
    return result


def _constant(name: str, where: str) -> NoReturn:
    raise _Refused(ManifestInvalid(f"non-standard JSON number {name}", where=where,
                                   fix="Documents carry no NaN or Infinity; write a number or a decimal string."))


def _check_encodable(value: Any, where: str) -> None:
    pending = [value]  # a loop, not recursion: the parser already allowed this depth
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ManifestInvalid("string holds a lone UTF-16 surrogate", where=where,
                                      fix="Write text as valid UTF-8; the document was not loaded.") from None


def load_json(data: bytes | str, *, where: str) -> Any:
    """Parse ``data``; ManifestInvalid (DuplicateKey for a repeated key) on anything ambiguous or malformed."""
    try:
        value = json.loads(data, object_pairs_hook=lambda pairs: _object(pairs, where),
                           parse_constant=lambda name: _constant(name, where))
    except _Refused as refused:
        raise refused.error from None
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ManifestInvalid(f"not valid JSON ({type(error).__name__}: {error})", where=where,
                              fix="Repair the JSON; the document was not loaded.") from None
    _check_encodable(value, where)
    return value
