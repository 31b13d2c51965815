"""Mirroring policy: which requests may be copied to a shadow revision.

A request that declares or calls a side-effecting tool is never mirrored: the shadow would act on
the world a second time. A body that cannot be read is treated the same way (cannot prove harmless).
"""

from __future__ import annotations

import json
from typing import Any

from manifests.route import ALL_TOOLS


def tool_names(request: dict[str, Any]) -> set[str]:
    """Tool names a chat request declares (``tools``) or carries as calls in its messages."""
    names: set[str] = set()
    for tool in request.get("tools") or ():
        if isinstance(tool, dict):
            function = tool.get("function") or {}
            names.add(str(function.get("name", tool.get("name", ""))))
    for message in request.get("messages") or ():
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls or ():
            if isinstance(call, dict):
                names.add(str((call.get("function") or {}).get("name", "")))
    if request.get("functions"):
        names.update(str(item.get("name", "")) for item in request["functions"] if isinstance(item, dict))
    return names


def side_effecting(body: bytes, side_effecting_tools: frozenset[str]) -> bool:
    """True when a request must never be mirrored: it uses a side-effecting tool, or cannot be read."""
    if b'"tool' not in body and b'"function' not in body:
        return False  # cheap path: no tools anywhere in the body
    try:
        request = json.loads(body)
    except ValueError:
        return True  # unreadable: cannot prove it harmless
    if not isinstance(request, dict):
        return True
    names = tool_names(request)
    if not names:
        return False
    return ALL_TOOLS in side_effecting_tools or bool(names & side_effecting_tools)
