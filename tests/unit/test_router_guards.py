"""The router's guards as plain functions: request ids, the admin token rule, the mirror's byte bound."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from revgate.serving.admin_token import AdminTokenInvalid, authorized, load_admin_token
from revgate.serving.router.ids import RequestIds
from revgate.serving.router.limits import Limits, over_budget
from revgate.shadow.mirror import MirrorJob, ShadowAnswer, ShadowMirror
from revgate.shadow.records import prompt_text


def test_request_ids_are_unique_random_hex() -> None:
    ids = RequestIds()
    made = [ids.next() for _ in range(5000)]  # crosses several refills of the random pool
    assert len(set(made)) == len(made)
    assert all(re.fullmatch(rb"[0-9a-f]{24}", item) for item in made)
    assert RequestIds().next() not in made  # another process or router starts elsewhere


@pytest.mark.parametrize(("header", "ok"), [
    (b"Bearer 0123456789abcdef", True),
    (b"0123456789abcdef", False),
    (b"bearer 0123456789abcdef", False),
    (b"Bearer  0123456789abcdef", False),
    (b"Bearer 0123456789abcdef ", False),
    (b"Bearer 0123456789abcde", False),
    (b"Bearer ", False),
    (None, False),
])
def test_admin_needs_exactly_bearer_and_the_token(header: bytes | None, ok: bool) -> None:
    assert authorized(header, "0123456789abcdef") is ok


def test_a_token_file_others_can_read_or_a_short_token_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123\n")
    token.chmod(0o600)
    assert load_admin_token(token) == "0123456789abcdef0123"
    for mode in (0o644, 0o640, 0o604):
        token.chmod(mode)
        with pytest.raises(AdminTokenInvalid, match="readable by other users") as refused:
            load_admin_token(token)
        assert "chmod 600" in refused.value.fix
    token.chmod(0o600)
    token.write_text("short")
    with pytest.raises(AdminTokenInvalid, match="shorter than 16"):
        load_admin_token(token)
    with pytest.raises(AdminTokenInvalid, match="cannot read"):
        load_admin_token(tmp_path / "missing")


def job(size: int) -> MirrorJob:
    return MirrorJob(request_id="r", route="chat", generation=1, path="/v1/completions", body=b"x" * size,
                     target=None, stable_revision="a", shadow_revision="b", stable_status=200, stable_output="ok",
                     stable_ttft_s=None, stable_e2e_s=None)


async def never(_: MirrorJob) -> ShadowAnswer:  # pragma: no cover - the workers are not started here
    raise AssertionError


def test_the_mirror_drops_copies_past_its_byte_bound_not_only_its_count() -> None:
    mirror = ShadowMirror(never, lambda _: None, capacity=256, capacity_bytes=10_000)
    assert mirror.offer(job(4000)) and mirror.offer(job(4000))
    assert not mirror.offer(job(4000))  # 12 kB would be held: dropped though the queue has room
    assert mirror.offer(job(1000))
    assert (mirror.counters.offered, mirror.counters.dropped) == (4, 1)
    assert mirror.held_bytes == 4000 + 2 + 4000 + 2 + 1000 + 2


def test_a_new_request_is_shed_for_the_budget_it_passes_and_named_by_its_flag() -> None:
    limits = Limits(max_buffered_bytes=100, max_record_bytes=50)
    assert over_budget(limits, 100, 50) is None  # at the budget is within it
    assert over_budget(limits, 101, 0) == ("answers unsent to callers passed 100 bytes", "--max-buffered-bytes")
    what, flag = over_budget(limits, 0, 51) or ("", "")
    assert flag == "--max-record-bytes" and "kept for the records" in what and "50" in what
    assert over_budget(limits, 101, 51) == over_budget(limits, 101, 0)  # unsent first: callers wait on it


def test_every_limit_has_a_positive_default_and_the_watchdog_ticks_within_the_shortest_timeout() -> None:
    limits = Limits()
    assert limits.max_body_bytes == 4 * 1024 * 1024 and limits.max_header_bytes == 64 * 1024
    assert 0 < limits.tick_s <= min(limits.header_timeout_s, limits.body_timeout_s, limits.idle_timeout_s) / 4
    assert Limits(header_timeout_s=1.0).tick_s == 0.25


@pytest.mark.parametrize(("body", "expected"), [
    (b'{"prompt": "sort 3142="}', "sort 3142="),
    (b'{"prompt": ["a", "b"]}', "a\nb"),
    (b'{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}',
     "system: be brief\nuser: hi"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}]}]}', "user: look"),
    (b'{"input": "x"}', None),
    (b"not json", None),
    (b"[1, 2]", None),
])
def test_a_paired_record_keeps_what_the_caller_asked(body: bytes, expected: str | None) -> None:
    assert prompt_text(body) == expected
