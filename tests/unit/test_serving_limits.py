"""The revision's interface policy, as the routers enforce it: output tokens, deadline, retries, shadowed tools."""

from __future__ import annotations

from datetime import UTC, datetime

from revgate.manifests.revision import InterfacePolicy
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import as_target, mirror, serving_limits, successor
from revgate.serving.router.parse import cap_output_tokens
from revgate.serving.router.split import compile_route

STABLE, CANDIDATE = "sha256:" + "a" * 64, "sha256:" + "b" * 64
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
POLICY = InterfacePolicy(max_output_tokens=64, request_timeout_ms=5_000, max_retries=0,
                         side_effecting_tools=("send_email",))


def test_the_pinned_revisions_limits_travel_with_its_target_through_every_route_change() -> None:
    limits = serving_limits(POLICY)
    target = RevisionTarget(fingerprint=CANDIDATE, endpoints=("http://127.0.0.1:2",), limits=limits)
    first = RouteSnapshot.build(route="chat", generation=1, created_by="t", created_at=NOW.isoformat(),
                                stable={"fingerprint": STABLE, "endpoints": ["http://127.0.0.1:1"]})
    shadowed = successor(first, by="flow", now=NOW, shadow=mirror(target, 1_000_000, NOW, 60))
    assert shadowed.shadow is not None and shadowed.shadow.limits == limits
    assert shadowed.shadow.side_effecting_tools == ("send_email",)  # named: other tools' calls may be mirrored
    promoted = successor(shadowed, by="flow", now=NOW, stable=as_target(target), shadow=None)
    assert promoted.stable.limits == limits  # the limits it was gated under are the ones it serves under
    pinned = compile_route(promoted)
    assert (pinned.stable.max_output_tokens, pinned.stable.timeout_s, pinned.stable.max_retries) == (64, 5.0, 0)
    unnamed = RevisionTarget(fingerprint=CANDIDATE, endpoints=("http://127.0.0.1:2",),
                             limits=serving_limits(InterfacePolicy()))
    assert mirror(unnamed, 1_000_000, NOW, 60).side_effecting_tools == ("*",)  # none named: no tool call mirrored
    bare = compile_route(first)
    assert bare.stable.max_output_tokens is None and bare.stable.timeout_s is None and bare.stable.max_retries is None


def test_output_tokens_are_held_to_the_revisions_cap() -> None:
    asks = {"max_tokens": 4000, "max_completion_tokens": 10}
    assert cap_output_tokens(asks, 64, chat=True) and asks == {"max_tokens": 64, "max_completion_tokens": 10}
    unlimited_chat: dict[str, object] = {"messages": []}
    assert cap_output_tokens(unlimited_chat, 64, chat=True) and unlimited_chat["max_tokens"] == 64
    completion: dict[str, object] = {"prompt": "hi"}  # the API's own default there is 16
    assert not cap_output_tokens(completion, 64, chat=False) and "max_tokens" not in completion
    within = {"max_tokens": 8}
    assert not cap_output_tokens(within, 64, chat=False) and within == {"max_tokens": 8}
    assert not cap_output_tokens(["not", "an", "object"], 64, chat=True)
    odd = {"max_tokens": True, "max_completion_tokens": "9000"}  # not numbers: the engine answers them
    assert not cap_output_tokens(odd, 64, chat=False) and odd == {"max_tokens": True, "max_completion_tokens": "9000"}
