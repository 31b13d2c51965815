"""Mirroring policy: which requests may be copied to a shadow revision.

A request that declares or calls a side-effecting tool is never mirrored: the shadow would act on
the world a second time. A body that cannot be read is treated the same way (cannot prove harmless).
"""

from __future__ import annotations

import json
from typing import Any

from revgate.manifests.route import ALL_TOOLS


def tool_names(request: dict[str, Any]) -> set[str]:
    """Tool names a chat request declares (``tools``, ``functions``) or carries as calls in its messages.

    Total over any JSON shape: a field of the wrong type names no tool (the engine refuses or
    ignores it); a name that is not a string is kept as its JSON text, so it can still match nothing.
    """
    names: set[str] = set()
    for tool in _items(request.get("tools")):
        function = tool.get("function")
        names.add(_name(function.get("name") if isinstance(function, dict) else tool.get("name")))
    for message in _items(request.get("messages")):
        for call in _items(message.get("tool_calls")):
            function = call.get("function")
            names.add(_name(function.get("name") if isinstance(function, dict) else None))
    for function in _items(request.get("functions")):
        names.add(_name(function.get("name")))
    return names


def _items(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON list; anything else holds none."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _name(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def side_effecting(body: bytes, side_effecting_tools: frozenset[str]) -> bool:
    """True when a request must never be mirrored: it uses a side-effecting tool, or cannot be read."""
    if b'"tool' not in body and b'"function' not in body and b"\\u" not in body:
        return False  # cheap path: no tools anywhere in the body, and no escape that could spell one
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return True  # unreadable: cannot prove it harmless
    return side_effecting_document(request, side_effecting_tools)


def side_effecting_document(request: Any, side_effecting_tools: frozenset[str]) -> bool:
    """:func:`side_effecting` on a body already parsed (anything but a JSON object counts as unreadable)."""
    if not isinstance(request, dict):
        return True
    names = tool_names(request)
    if not names:
        return False
    return ALL_TOOLS in side_effecting_tools or bool(names & side_effecting_tools)
