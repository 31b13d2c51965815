"""The error base class every revgate error derives from.

Each error says what is wrong, where, and what to do, so a release manager reading a failed
flow run can act without reading code.
"""

from __future__ import annotations


class RevgateError(Exception):
    """Base class: ``what`` went wrong, ``where`` (file, field, URL), and ``fix`` (what to do)."""

    def __init__(self, what: str, *, where: str = "", fix: str = "") -> None:
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.what]
        if self.where:
            parts.append(f"at {self.where}")
        text = " ".join(parts)
        return f"{text}. {self.fix}" if self.fix else text


class ManifestInvalid(RevgateError):
    """A document (manifest, config, snapshot, policy) is malformed and was not constructed."""


class DuplicateKey(ManifestInvalid):
    """A JSON object names the same key twice; which value counts would depend on the parser."""


class NotCanonical(ManifestInvalid):
    """A document read by digest is not in canonical form, so one document would have two digests."""
