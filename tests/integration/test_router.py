"""The router end to end over real HTTP: `revgate router` in a subprocess, real upstream servers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from revgate.evaluation.records import RequestRecord
from revgate.shadow.records import PairedRecord
from tests.conftest import ROOT
from tests.integration.router_harness import (
    RouterProcess,
    UpstreamFarm,
    fingerprint,
    router_process,
    snapshot,
    wait_until,
)

pytestmark = pytest.mark.servers

ROUTE = "chat"


@pytest.fixture(scope="module")
def farm() -> Iterator[UpstreamFarm]:
    with UpstreamFarm(["a1", "a2", "b1", "s1"]) as upstreams:
        yield upstreams


@pytest.fixture(scope="module")
def router(farm: UpstreamFarm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    folder = tmp_path_factory.mktemp("router")
    with router_process(folder, ROUTE, snapshot(ROUTE, 1, [farm["a1"], farm["a2"]])) as process:
        yield process


def stable_a(farm: UpstreamFarm) -> Any:
    return lambda generation, **kwargs: snapshot(ROUTE, generation, [farm["a1"], farm["a2"]], **kwargs)


def complete(router: RouterProcess, **headers: str) -> httpx.Response:
    body = {"model": ROUTE, "prompt": "hi", "max_tokens": 2}
    return httpx.post(f"{router.url}/v1/completions", json=body, headers=headers, timeout=10)


def records(router: RouterProcess, caller_prefix: str, count: int) -> list[RequestRecord]:
    """The records of the requests the caller named ``caller_prefix...``, once ``count`` are written.

    Records are flushed in batches: poll for them rather than wait a fixed time.
    """
    found: list[RequestRecord] = []

    def written() -> bool:
        found[:] = [record for record in map(RequestRecord.from_json, router.records_lines())
                    if record.caller_request_id.startswith(caller_prefix)]
        return len(found) >= count

    wait_until(written, timeout=10)
    return found


def test_official_openai_client_works_through_the_router(router: RouterProcess, farm: UpstreamFarm) -> None:
    router.commit(stable_a(farm))
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(model=ROUTE, prompt="hi", max_tokens=3)
    assert completion.choices[0].text.startswith(("a1-0", "a2-0"))
    chat = client.chat.completions.create(model=ROUTE, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.choices[0].message.content and chat.usage and chat.usage.completion_tokens == 3
    pieces = [chunk.choices[0].delta.content for chunk in client.chat.completions.create(
        model=ROUTE, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True)]
    assert len(pieces) == 5 and all(piece and piece.startswith(("a1-", "a2-")) for piece in pieces)
    streamed = list(client.completions.create(model=ROUTE, prompt="hi", max_tokens=4, stream=True))
    assert [chunk.choices[0].finish_reason for chunk in streamed][-1] == "length"
    assert [model.id for model in client.models.list()] in (["a1"], ["a2"])


def test_streams_in_flight_finish_on_the_revision_they_started_with(router: RouterProcess, farm: UpstreamFarm) -> None:
    start = router.commit(stable_a(farm))
    results: list[tuple[str, str, str]] = []
    started: list[str] = []
    finished: list[float] = []

    def stream() -> None:
        body = {"model": ROUTE, "prompt": "hi", "max_tokens": 12, "stream": True, "user": "delay-ms:100"}
        with httpx.stream("POST", f"{router.url}/v1/completions", json=body, timeout=20) as response:
            started.append(response.headers["x-revgate-generation"])
            text = "".join(response.iter_text())
            results.append((response.headers["x-revgate-generation"], response.headers["x-revgate-revision"], text))
            finished.append(time.monotonic())

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(started) == 4)  # every stream is pinned and has tokens still to come
    swapped = router.commit(lambda generation: snapshot(ROUTE, generation, [farm["b1"]]))
    swapped_at = time.monotonic()
    after = complete(router)
    for thread in threads:
        thread.join(20)
    assert after.headers["x-revgate-generation"] == str(swapped.generation)
    assert after.headers["x-revgate-revision"] == fingerprint("b") and "b1-0" in after.text
    assert len(results) == 4 and min(finished) > swapped_at  # the swap happened mid-stream
    for generation, revision, text in results:
        assert (generation, revision) == (str(start.generation), fingerprint("a"))
        assert "a1-11" in text or "a2-11" in text  # the last token arrived, from revision a
        assert "b1-" not in text and "[DONE]" in text


def test_canary_assignment_is_sticky_per_session(router: RouterProcess, farm: UpstreamFarm) -> None:
    router.commit(stable_a(farm), candidate=[farm["b1"]], weight_ppm=300_000)
    first = {f"s{index}": complete(router, **{"x-session-id": f"s{index}"}).headers["x-revgate-arm"]
             for index in range(120)}
    again = {key: complete(router, **{"x-session-id": key}).headers["x-revgate-arm"] for key in first}
    assert first == again
    share = sum(arm == "candidate" for arm in first.values()) / len(first)
    assert 0.15 < share < 0.45  # 30% +- 3.5 sigma for 120 sessions


def test_expired_candidate_lease_reverts_new_requests_to_stable(router: RouterProcess, farm: UpstreamFarm) -> None:
    router.commit(stable_a(farm), candidate=[farm["b1"]], weight_ppm=1_000_000, lease_s=2)
    assert complete(router).headers["x-revgate-arm"] == "candidate"
    answers: list[httpx.Response] = []
    # No new snapshot: the lease alone reverts traffic (polled; the lease is 2 s).
    wait_until(lambda: answers.append(complete(router)) or answers[-1].headers["x-revgate-arm"] == "stable",
               timeout=15)
    assert "b1" not in answers[-1].text and answers[-1].headers["x-revgate-revision"] == fingerprint("a")


def test_shadow_never_reaches_the_caller_and_skips_side_effecting_tools(
    router: RouterProcess, farm: UpstreamFarm
) -> None:
    router.commit(stable_a(farm), shadow=[farm["s1"]], sample_ppm=1_000_000, side_effecting_tools=("send_email",))
    farm["s1"].seen.clear()
    plain = {"model": ROUTE, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}
    labelled = {**plain, "metadata": {"revgate_class": "probe", "app": "mail"}}  # labels for the router only
    response = httpx.post(f"{router.url}/v1/chat/completions", json=labelled, headers={"x-request-id": "mirror-me"})
    assert response.status_code == 200 and "s1" not in response.text
    tools = [{"type": "function", "function": {"name": "send_email", "parameters": {}}}]
    risky = {**plain, "tools": tools}
    response = httpx.post(f"{router.url}/v1/chat/completions", json=risky, headers={"x-request-id": "never-mirror"})
    assert response.status_code == 200 and "s1" not in response.text
    wait_until(lambda: router.paired.exists() and "mirror-me" in router.paired.read_text())
    # Upstreams see the router's ids, never the caller's; the records map one to the other.
    ids = {record.caller_request_id: record.request_id
           for prefix in ("mirror-me", "never-mirror") for record in records(router, prefix, 1)}
    seen_ids = {request["headers"].get("x-request-id") for request in farm["s1"].seen}
    assert ids["mirror-me"] in seen_ids and ids["never-mirror"] not in seen_ids
    # The copy is made from the request parsed at entry: its evidence metadata dropped, as stable's copy's was.
    # Before, the send parsed the caller's bytes again, and the shadow saw the router's labels.
    copy = next(r["body"] for r in farm["s1"].seen if r["headers"].get("x-request-id") == ids["mirror-me"])
    assert copy["metadata"] == {"app": "mail"} and copy["messages"] == plain["messages"]
    assert not seen_ids & {"mirror-me", "never-mirror"}
    pair = next(PairedRecord.from_json(line) for line in router.paired.read_text().splitlines()
                if "mirror-me" in line)
    assert (pair.request_id, pair.caller_request_id) == (ids["mirror-me"], "mirror-me")
    assert pair.shadow_output and pair.shadow_output.startswith("s1-0")
    assert pair.stable_output and pair.stable_output.startswith(("a1-0", "a2-0"))
    assert pair.shadow_revision == fingerprint("s") and pair.stable_revision == fingerprint("a")
    assert (pair.shadow_prompt_tokens, pair.shadow_output_tokens) == (3, 3)  # the shadow's own usage block
    assert pair.prompt == "user: hello"  # what was asked, for a judge that reads it


def test_corrupt_snapshot_in_the_store_is_ignored_and_the_last_good_one_kept(router: RouterProcess,
                                                                              farm: UpstreamFarm) -> None:
    good = router.commit(stable_a(farm))
    # The store heals a corrupt current from its history: only when every copy is corrupt does it
    # have nothing valid to give, and the router must keep serving what it has.
    folder = router.store.root / ROUTE
    files = [folder / "current.json", *sorted((folder / "history").glob("*.json"))]
    saved = {path: path.read_bytes() for path in files}
    try:
        for path in files:
            path.write_text('{"kind": "RouteSnapshot", "generation": 999, "stable": ')
        assert router.notify()["result"] == "invalid"
        response = complete(router)
        assert response.status_code == 200
        assert response.headers["x-revgate-generation"] == str(good.generation)
    finally:
        for path, content in saved.items():
            path.write_bytes(content)
    metrics = httpx.get(f"{router.admin_url}/metrics").text
    assert 'revgate_router_snapshot_invalid_total{route="chat"}' in metrics


def test_retry_before_first_byte_stays_on_the_pinned_revision(router: RouterProcess, farm: UpstreamFarm) -> None:
    router.commit(stable_a(farm))
    farm["a1"].fail_next = 1000  # replica a1 is draining: it refuses everything with 503
    try:
        # Round robin: one of two requests is tried on a1 first and must be retried on a2.
        for name in ("retried-0", "retried-1"):
            response = complete(router, **{"x-request-id": name})
            assert response.status_code == 200 and response.headers["x-revgate-revision"] == fingerprint("a")
            assert "a2-0" in response.text
    finally:
        farm["a1"].fail_next = 0
    attempts = records(router, "retried-", 3)  # two requests, one of them tried twice
    retried = [record for record in attempts if record.attempt == 2]
    assert len(retried) == 1
    first = next(record for record in attempts if record.request_id == retried[0].request_id and record.attempt == 1)
    assert (first.outcome, first.status_code, retried[0].outcome) == ("error", 503, "ok")
    assert first.endpoint == farm["a1"].url and retried[0].endpoint == farm["a2"].url


def test_caller_disconnect_cancels_the_upstream_stream(router: RouterProcess, farm: UpstreamFarm) -> None:
    router.commit(stable_a(farm))
    before = farm["a1"].cancelled + farm["a2"].cancelled
    body = {"model": ROUTE, "prompt": "hi", "max_tokens": 200, "stream": True, "user": "delay-ms:50"}
    with httpx.stream("POST", f"{router.url}/v1/completions", json=body, timeout=20,
                      headers={"x-request-id": "walked-away"}) as response:
        next(response.iter_raw())
    wait_until(lambda: farm["a1"].cancelled + farm["a2"].cancelled == before + 1)
    outcome = [record.outcome for record in records(router, "walked-away", 1)]
    assert outcome == ["cancelled"]


def test_a_stream_the_caller_closes_after_done_is_served_not_cancelled(router: RouterProcess,
                                                                       farm: UpstreamFarm) -> None:
    # The OpenAI SDK closes the connection as soon as it reads [DONE]; an engine under load may
    # send the end of the body later. The answer was whole: it must count as served, with its tokens.
    router.commit(stable_a(farm))
    for name in ("a1", "a2"):
        farm[name].linger_after_done_s = 2.0
    try:
        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
        stream = client.completions.create(model=ROUTE, prompt="hi", max_tokens=4, stream=True,
                                           extra_headers={"x-request-id": "closed-after-done"})
        assert [chunk.choices[0].finish_reason for chunk in stream][-1] == "length"
        [record] = records(router, "closed-after-done", 1)
    finally:
        for name in ("a1", "a2"):
            farm[name].linger_after_done_s = 0.0
    assert (record.outcome, record.output_tokens, record.error) == ("ok", 4, ""), record


def test_admin_needs_the_token_and_metrics_are_bounded(router: RouterProcess) -> None:
    assert httpx.post(f"{router.admin_url}/admin/notify").status_code == 401
    wrong = httpx.post(f"{router.admin_url}/admin/notify", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.post(f"{router.url}/admin/notify").status_code == 404  # not on the public port
    complete(router)
    metrics = httpx.get(f"{router.admin_url}/metrics").text
    assert "revgate_router_requests_total{" in metrics and "revgate_router_ttft_seconds_bucket{" in metrics
    assert "request_id" not in metrics and "x-request-id" not in metrics


def test_route_set_with_a_stale_generation_is_refused_and_changes_nothing(router: RouterProcess) -> None:
    current = router.store.read(ROUTE)
    assert current is not None
    command = [sys.executable, "-m", "revgate.cli.main",
               "route", "set", "--routes", str(router.store.root), "--route", ROUTE,
               "--stable", fingerprint("z"), "--stable-endpoints", "http://127.0.0.1:1",
               "--expect-generation", str(current.generation - 1), "--created-by", "late"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "RouteConflict" in result.stderr and f"generation {current.generation}" in result.stderr
    assert router.store.read(ROUTE) == current
    shown = subprocess.run([sys.executable, "-m", "revgate.cli.main",
                            "route", "show", "--routes", str(router.store.root),
                            "--route", ROUTE], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(shown.stdout)["generation"] == current.generation
    history = subprocess.run([sys.executable, "-m", "revgate.cli.main", "route", "history", "--routes",
                              str(router.store.root), "--route", ROUTE], cwd=ROOT, capture_output=True, text=True,
                             check=True)
    assert len(history.stdout.splitlines()) == current.generation


def test_unknown_store_path_fails_fast(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "revgate.cli.main",
               "route", "show", "--routes", str(tmp_path), "--route", "nothing"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "RouteNotFound" in result.stderr


def test_deadline_answers_504_and_records_a_timeout(router: RouterProcess, farm: UpstreamFarm) -> None:
    router.commit(stable_a(farm))
    body = {"model": ROUTE, "prompt": "hi", "max_tokens": 10, "user": "delay-ms:100"}
    response = httpx.post(f"{router.url}/v1/completions", json=body, timeout=10,
                          headers={"x-revgate-timeout-ms": "200", "x-request-id": "too-slow"})
    assert response.status_code == 504 and response.headers["x-revgate-revision"] == fingerprint("a")
    assert [record.outcome for record in records(router, "too-slow", 1)] == ["timeout"]
    assert complete(router).status_code == 200  # the router serves on after a timeout


def shadow_events(router: RouterProcess) -> dict[str, float]:
    """The router's mirror counters from /metrics, by event."""
    counts: dict[str, float] = {}
    for line in httpx.get(f"{router.admin_url}/metrics", timeout=5).text.splitlines():
        if line.startswith("revgate_router_shadow_"):
            event = line.removeprefix("revgate_router_").split("_total", 1)[0]
            counts[event] = float(line.rsplit(" ", 1)[1])
    return counts


def test_copies_queued_for_a_shadow_the_route_dropped_are_never_sent(
    router: RouterProcess, farm: UpstreamFarm
) -> None:
    # The shadow stage ends while the mirror still holds a backlog: those copies must not load the
    # revision the next stage measures (it is the canary's candidate, or nothing after a rollback).
    router.commit(stable_a(farm), shadow=[farm["s1"]], sample_ppm=1_000_000)
    before = shadow_events(router)
    farm["s1"].seen.clear()
    body = {"model": ROUTE, "prompt": "hi", "max_tokens": 2, "user": "delay-ms:150"}
    with httpx.Client(timeout=10) as client, ThreadPoolExecutor(max_workers=40) as pool:
        answers = list(pool.map(lambda n: client.post(f"{router.url}/v1/completions", json=body,
                                                      headers={"x-request-id": f"backlog-{n}"}), range(40)))
    assert all(answer.status_code == 200 for answer in answers)
    router.commit(stable_a(farm))  # the shadow stage is over: no shadow on the route
    mirrored = shadow_events(router).get("shadow_mirrored", 0) - before.get("shadow_mirrored", 0)

    def settled() -> bool:
        now = shadow_events(router)
        done = sum(now.get(name, 0) - before.get(name, 0) for name in ("shadow_sent", "shadow_stale"))
        return done >= mirrored

    wait_until(settled, timeout=20)
    stale = shadow_events(router).get("shadow_stale", 0) - before.get("shadow_stale", 0)
    # Four mirror workers at 0.3 s a copy: most of the 40 were still queued when the route changed.
    assert mirrored == 40 and stale >= 20, (mirrored, stale)
    assert len(farm["s1"].seen) <= 40 - stale


def test_callers_pick_neither_their_arm_nor_their_evidence(router: RouterProcess, farm: UpstreamFarm) -> None:
    """The reproduction: a tenant that knows the route and the candidate chose its canary sessions in advance,
    read its arm from every answer, and declared its own slice, probe class and task. Now the cohort has the
    rollout's secret, answers name no revision, and labels count only with the route's probe credential."""
    import hashlib
    import secrets

    from revgate.serving.router.split import bucket_ppm

    probe = secrets.token_urlsafe(32)
    candidate_fingerprint = fingerprint("b")
    make = lambda generation, **kwargs: snapshot(  # noqa: E731 - one route, read at once
        ROUTE, generation, [farm["a1"]], candidate=[farm["b1"]], weight_ppm=100_000, reveal_revision=False,
        cohort_secret=secrets.token_hex(32), probe_credential="sha256:" + hashlib.sha256(probe.encode()).hexdigest())
    router.commit(make)
    # The sessions a caller would have computed to land on a 10 % canary: route and fingerprint were the salt.
    chosen = [f"tenant-{index}" for index in range(800)
              if bucket_ppm(f"{ROUTE}|{candidate_fingerprint}".encode(), f"tenant-{index}".encode()) < 100_000]
    before = len(farm["b1"].seen)
    answers = [complete(router, **{"x-session-id": key}) for key in chosen]
    assert all(answer.status_code == 200 for answer in answers)
    landed = len(farm["b1"].seen) - before
    assert landed < 0.25 * len(chosen), (landed, len(chosen))  # about 10 %: chosen sessions are like any others
    hidden = ("x-revgate-revision", "x-revgate-arm", "x-revgate-generation")
    assert not any(name in answer.headers for answer in answers for name in hidden)
    assert all(answer.headers["x-request-id"] != "" for answer in answers)

    steer = {"x-revgate-slices": "family=sort;length=long", "x-revgate-class": "probe", "x-revgate-task": "sql"}
    body = {"model": ROUTE, "prompt": "hi", "max_tokens": 2, "metadata": {"revgate_class": "probe", "app": "mail"}}
    seen_before = {name: len(farm[name].seen) for name in ("a1", "b1")}
    hostile = httpx.post(f"{router.url}/v1/completions", json=body, timeout=10,
                         headers={"x-request-id": "step01-b0-t1", "x-revgate-credential": "a-guess", **steer})
    trusted = httpx.post(f"{router.url}/v1/completions", json=body, timeout=10,
                         headers={"x-request-id": "probe-1", "x-revgate-credential": probe, **steer})
    assert hostile.status_code == trusted.status_code == 200
    assert "x-revgate-arm" not in hostile.headers and trusted.headers["x-revgate-arm"] in ("stable", "candidate")
    hostile_record, = records(router, "step01-b0-t1", 1)
    trusted_record, = records(router, "probe-1", 1)
    assert hostile_record.slices == {}, hostile_record  # the caller's claim, not evidence
    assert trusted_record.slices == {"family": "sort", "length": "long", "class": "probe", "task": "sql"}
    assert hostile_record.request_id == hostile.headers["x-request-id"]  # the router's id, which the prober learns
    asked = [seen for name in ("a1", "b1") for seen in farm[name].seen[seen_before[name]:]]
    assert len(asked) == 2 and all(item["body"]["metadata"] == {"app": "mail"} for item in asked)
    assert not any(key.startswith("x-revgate") for item in asked for key in item["headers"])


def test_the_revisions_interface_policy_is_what_the_router_enforces(router: RouterProcess, farm: UpstreamFarm) -> None:
    """The defect: InterfacePolicy (output token cap, timeout, retries) was fingerprinted, never enforced."""
    from revgate.manifests.route import RouteSnapshot

    # A deadline well above an instant upstream's answer on a loaded machine (1.5 s once cut a plain answer
    # with the gated rollouts running beside), and well below the slow answer's delay.
    limits = {"max_output_tokens": 3, "request_timeout_ms": 5_000, "max_retries": 0}

    def make(generation: int) -> RouteSnapshot:
        plain = snapshot(ROUTE, generation, [farm["a1"]]).model_dump(mode="json")
        return RouteSnapshot.build(**{**plain, "stable": {**plain["stable"], "limits": limits}})

    router.commit(make)
    upstream = farm["a1"]
    before = len(upstream.seen)
    chat = {"model": ROUTE, "messages": [{"role": "user", "content": "hi"}]}
    asked_more = httpx.post(f"{router.url}/v1/chat/completions", json={**chat, "max_tokens": 50}, timeout=10)
    unbounded = httpx.post(f"{router.url}/v1/chat/completions", json=chat, timeout=10)
    assert asked_more.status_code == unbounded.status_code == 200
    assert [seen["body"]["max_tokens"] for seen in upstream.seen[before:]] == [3, 3]
    assert asked_more.json()["usage"]["completion_tokens"] == 3

    # The revision's deadline (5 s), not the route's (60 s): a slow answer is cut at the revision's.
    slow = httpx.post(f"{router.url}/v1/completions", timeout=30,
                      json={"model": ROUTE, "prompt": "hi", "max_tokens": 3, "user": "delay-ms:10000"})
    assert slow.status_code == 504, slow.text

    # No retry on this revision: the replica's refusal reaches the caller (the route alone would retry).
    upstream.fail_next = 1
    refused = complete(router)
    assert refused.status_code == 503, refused.text
    assert complete(router).status_code == 200


def test_an_operator_names_a_trusted_gateway_with_route_set(router: RouterProcess, farm: UpstreamFarm,
                                                           tmp_path: Path) -> None:
    import os

    router.commit(stable_a(farm))
    gateway = tmp_path / "gateway-credential"
    gateway.write_text("the-gateway-in-fronts-credential\n")
    os.chmod(gateway, 0o644)
    command = [sys.executable, "-m", "revgate.cli.main", "route", "set", "--routes", str(router.store.root),
               "--route", ROUTE, "--created-by", "ops", "--trusted-source-file", str(gateway),
               "--reveal-revision", "off"]
    before = router.store.read(ROUTE)
    refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "readable by other users" in refused.stderr, refused.stderr
    assert router.store.read(ROUTE) == before  # nothing written
    os.chmod(gateway, 0o600)
    subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    written = router.store.read(ROUTE)
    assert written is not None and len(written.trusted_sources) == 1 and not written.reveal_revision
    assert "the-gateway" not in written.model_dump_json()  # the store holds the digest alone
    router.notify()
    labelled = complete(router, **{"x-request-id": "gw-1", "x-revgate-credential": "the-gateway-in-fronts-credential",
                                   "x-revgate-task": "sql"})
    plain = complete(router, **{"x-request-id": "plain-1", "x-revgate-task": "sql"})
    assert "x-revgate-revision" in labelled.headers and "x-revgate-revision" not in plain.headers
    assert records(router, "gw-1", 1)[0].slices == {"task": "sql"}
    assert records(router, "plain-1", 1)[0].slices == {}
