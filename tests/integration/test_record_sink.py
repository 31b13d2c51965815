"""The record sink through real parts: router processes writing objects to an S3 prefix on moto's server."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from revgate.evaluation.evidence import build_evidence
from revgate.evaluation.gates import gates_from_policy, judge
from revgate.evaluation.graders import exact_match
from revgate.evaluation.records import RequestRecord
from revgate.evaluation.traces import TraceEntry
from revgate.flows.evidence import StageRecords
from revgate.flows.promote import with_provenance
from revgate.manifests.gates import GatePolicy
from revgate.registry.record_signing import FIELD
from revgate.registry.record_store import (
    ObjectName,
    RecordReader,
    RecordStore,
    StageWindow,
    open_record_store,
    parse_name,
)
from revgate.serving.worker.engine import free_port
from revgate.shadow.records import PairedRecord
from tests.conftest import wait_for_port
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
# The routes here trust a gateway's credential: the labels these tests declare are taken as evidence.
GATEWAY = "a-gateway-credential-for-these-tests"
TRUSTED = ("sha256:" + hashlib.sha256(GATEWAY.encode()).hexdigest(),)


@pytest.fixture(scope="module")
def farm() -> Iterator[UpstreamFarm]:
    with UpstreamFarm(["a1", "s1"]) as upstreams:
        yield upstreams


def bucket_url(endpoint: str) -> str:
    bucket = f"records-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/live?endpoint_url={endpoint}"


def sink_flags(url: str, router_id: str, *more: str) -> tuple[str, ...]:
    return ("--records-sink", url, "--router-id", router_id, "--sink-interval", "0.2", *more)


def complete(router: RouterProcess, name: str, **headers: str) -> httpx.Response:
    body = {"model": ROUTE, "prompt": "hi", "max_tokens": 2, "metadata": {"revgate_class": "interactive"}}
    response = httpx.post(f"{router.url}/v1/completions", json=body, timeout=10,
                          headers={"x-request-id": name, "x-revgate-credential": GATEWAY, **headers})
    assert response.status_code == 200
    return response


def admin(router: RouterProcess, path: str) -> httpx.Response:
    return httpx.get(f"{router.admin_url}{path}", headers={"Authorization": f"Bearer {router.token}"}, timeout=5)


def requests_reader(url: str) -> RecordReader[RequestRecord]:
    return RecordReader(open_record_store(url), ROUTE, "requests", lambda data: RequestRecord(**data))


def served(records: list[RequestRecord]) -> list[RequestRecord]:
    return [item for item in records if item.arm != "shadow"]


def gather(into: list[Any], items: Iterable[Any]) -> list[Any]:
    """Add a read's items to what was read before; the whole so far (for polling conditions)."""
    into.extend(items)
    return into


@contextlib.contextmanager
def two_routers(folder: Path, first: Any, url: str) -> Iterator[tuple[RouterProcess, RouterProcess]]:
    """Two routers (``host-a``, ``host-b``) serving ``first``, both writing to the sink at ``url``."""
    (folder / "a").mkdir()
    (folder / "b").mkdir()
    with router_process(folder / "a", ROUTE, first, extra=sink_flags(url, "host-a")) as one, \
            router_process(folder / "b", ROUTE, first, extra=sink_flags(url, "host-b")) as two:
        yield one, two


def test_two_routers_feed_one_prefix_and_reading_is_incremental(
    farm: UpstreamFarm, s3_endpoint: str, tmp_path: Path
) -> None:
    url = bucket_url(s3_endpoint)
    first = snapshot(ROUTE, 1, [farm["a1"]], shadow=[farm["s1"]], sample_ppm=1_000_000, trusted_sources=TRUSTED)
    with two_routers(tmp_path, first, url) as (one, two):
        for number in range(5):
            complete(one, f"a{number}", **{"x-revgate-task": "sql"})
        for number in range(3):
            complete(two, f"b{number}")
        reader = requests_reader(url)
        found: list[RequestRecord] = []
        wait_until(lambda: len(gather(found, served(reader.read().records))) >= 8, timeout=20)
        assert len(found) == 8
        by_router = {router: sum(1 for item in found if item.caller_request_id.startswith(router[-1]))
                     for router in ("host-a", "host-b")}
        assert by_router == {"host-a": 5, "host-b": 3}
        assert reader.totals["host-a"] >= 5 and reader.totals["host-b"] >= 3
        task_of = {item.caller_request_id: item.slices.get("task") for item in found}
        assert task_of["a0"] == "sql" and task_of["b0"] is None
        assert all(item.slices["class"] == "interactive" and item.generation == 1 for item in found)

        # Incremental: a second read returns only what was written since.
        complete(one, "a-late")
        later: list[RequestRecord] = []
        wait_until(lambda: bool(gather(later, served(reader.read().records))), timeout=20)
        assert [item.caller_request_id for item in later] == ["a-late"]

        # Shadow pairs of both routers land in the same prefix, read the same way.
        pairs = RecordReader(open_record_store(url), ROUTE, "paired", lambda data: PairedRecord(**data))
        paired: list[PairedRecord] = []
        wait_until(lambda: len(gather(paired, pairs.read().records)) >= 9, timeout=20)
        assert pairs.totals == {"host-a": 6, "host-b": 3}
        assert all(item.shadow_output and item.stable_output for item in paired)


def test_two_routers_feeding_one_canary_stage_give_one_report_that_counts_both(
    farm: UpstreamFarm, s3_endpoint: str, tmp_path: Path
) -> None:
    # Two routers on two hosts serve one route at a 50% canary; the stage reads both from the sink.
    url = bucket_url(s3_endpoint)
    since = time.time()
    first = snapshot(ROUTE, 1, [farm["a1"]], candidate=[farm["s1"]], weight_ppm=500_000)
    with two_routers(tmp_path, first, url) as (one, two):
        for number in range(60):
            complete(one, f"a{number}", **{"x-session-id": f"a{number}"})
            complete(two, f"b{number}", **{"x-session-id": f"b{number}"})
        stage = StageRecords(url, ROUTE, StageWindow(first_generation=1, since_s=since), paired=False)
        wait_until(lambda: stage.poll() >= 120, timeout=20)
    arms = stage.canary(fingerprint("a"), fingerprint("s"), {})
    policy = GatePolicy.build(min_samples_per_slice=10, max_samples_per_stage=100, look_every=20,
                              latency_metrics=[])
    evidence = build_evidence(arms.stable, arms.candidate, exact_match, expected_candidate_share=0.5)
    report = with_provenance(judge(gates_from_policy(policy, 0.5), policy, evidence), arms)

    assert len(arms.stable) + len(arms.candidate) == 120 and arms.stable and arms.candidate
    assert arms.per_router == {"host-a": 60, "host-b": 60}
    note = next(n for n in report.notes if n.startswith("evidence from the record sink"))
    assert f"stable {len(arms.stable)} user + 0 probe requests" in note
    assert "records per router: host-a 60, host-b 60" in note
    split = next(g for g in report.gates if g.gate == "sample-ratio")
    assert split.numbers["candidate"] == str(len(arms.candidate)) and split.numbers["stable"] == str(len(arms.stable))


class MotoServer:
    """A moto server this test can stop and start again on the same port (its buckets die with it)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, bucket: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, 30, self.process)
        boto3.client("s3", endpoint_url=self.url).create_bucket(Bucket=bucket)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


def sink_health(router: RouterProcess) -> dict[str, Any]:
    return admin(router, "/admin/health").json()["sinks"]["requests"]  # type: ignore[no-any-return]


def metric(router: RouterProcess, name: str) -> float:
    for line in httpx.get(f"{router.admin_url}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_busy_router_writes_one_object_per_interval_not_one_per_write(farm: UpstreamFarm, tmp_path: Path) -> None:
    """Records that arrive while an object is written wait for the next interval (the sink once wrote back to
    back while load lasted: an object every few milliseconds, each a file or an S3 request)."""
    interval, callers, each = 0.5, 4, 150
    sink = tmp_path / "sink"
    flags = ("--records-sink", str(sink), "--router-id", "host-a", "--sink-interval", str(interval))
    with router_process(tmp_path, ROUTE, snapshot(ROUTE, 1, [farm["a1"]]), extra=flags) as one:
        complete(one, "warm")
        wait_until(lambda: sink_health(one)["written_records"] == 1, timeout=20)
        objects_before = sink_health(one)["written_objects"]

        def caller(number: int) -> None:
            with httpx.Client(timeout=10) as client:
                for index in range(each):
                    response = client.post(f"{one.url}/v1/completions", headers={"x-request-id": f"c{number}-{index}"},
                                           json={"model": ROUTE, "prompt": "hi", "max_tokens": 2})
                    assert response.status_code == 200

        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(callers) as pool:
            list(pool.map(caller, range(callers)))
        elapsed = time.monotonic() - started
        wait_until(lambda: sink_health(one)["written_records"] == 1 + callers * each, timeout=20)
        written = sink_health(one)["written_objects"] - objects_before
    # One flush per interval while the load lasted, one more that took its tail, and one of slack for the edges.
    assert written <= elapsed / interval + 2, f"{written} objects in {elapsed:.1f} s at one per {interval} s"
    assert len(list(sink.rglob("*.jsonl"))) == objects_before + written


def test_an_unreachable_store_keeps_the_router_serving_bounded_and_visible_then_recovers(
    farm: UpstreamFarm, tmp_path: Path
) -> None:
    moto, bucket = MotoServer(), f"records-{uuid.uuid4().hex[:12]}"
    moto.start(bucket)
    url = f"s3://{bucket}/live?endpoint_url={moto.url}"
    try:
        first = snapshot(ROUTE, 1, [farm["a1"]])
        with router_process(tmp_path, ROUTE, first, extra=sink_flags(url, "host-a", "--sink-capacity", "4")) as one:
            complete(one, "before")
            wait_until(lambda: sink_health(one)["written_records"] == 1, timeout=20)

            moto.stop()
            for number in range(12):
                complete(one, f"down{number}")  # served all along
            wait_until(lambda: sink_health(one)["failures"] >= 2 and sink_health(one)["held"] > 0, timeout=20)
            health = admin(one, "/admin/health").json()
            assert health["status"] == "degraded" and not health["sinks"]["requests"]["ok"]
            requests = health["sinks"]["requests"]
            assert requests["held"] <= 2 * 4  # one failed batch plus a full queue, at most
            assert requests["dropped"] >= 12 - 2 * 4
            assert "cannot write request records" in requests["last_error"]
            assert metric(one, "revgate_router_requests_sink_failures_total") >= 2
            assert metric(one, "revgate_router_requests_sink_ok") == 0
            assert metric(one, "revgate_router_requests_sink_dropped_total") == requests["dropped"]

            moto.start(bucket)  # back, empty
            wait_until(lambda: sink_health(one)["ok"] and sink_health(one)["held"] == 0, timeout=30)
            assert admin(one, "/admin/health").json()["status"] == "ok"
            complete(one, "after")
            reader = requests_reader(url)
            names: list[str] = []
            dropped: list[int] = []

            def poll() -> bool:
                found = reader.read()
                names.extend(item.caller_request_id for item in found.records)
                dropped.extend(found.dropped.values())
                return "after" in names

            wait_until(poll, timeout=20)
            kept = [name for name in names if name.startswith("down")]
            assert len(kept) == 12 - sink_health(one)["dropped"]
            assert sum(dropped) == sink_health(one)["dropped"]  # the reader sees the drops: missing evidence
            assert "down11" in kept  # the newest are kept; the oldest queued were dropped
        assert (tmp_path / "router.log").read_text().count("cannot write") >= 1  # logged, once per period
    finally:
        moto.stop()


def test_a_records_file_that_cannot_be_written_keeps_the_router_serving_bounded_and_loud(
    farm: UpstreamFarm, tmp_path: Path
) -> None:
    # The defect: the file writer's task died on its first OSError (a full disk) and then held every
    # record in memory, silently: health said ok. /dev/full fails every write with ENOSPC.
    first = snapshot(ROUTE, 1, [farm["a1"]])
    flags = ("--records", "/dev/full", "--sink-capacity", "5")
    with router_process(tmp_path, ROUTE, first, extra=flags) as router:
        for number in range(3):
            assert complete(router, f"full-a{number}").status_code == 200
        wait_until(lambda: admin(router, "/admin/health").json()["files"]["requests"]["failures"] >= 2, timeout=20)
        for number in range(12):
            assert complete(router, f"full-b{number}").status_code == 200  # served all along
        wait_until(lambda: admin(router, "/admin/health").json()["files"]["requests"]["dropped"] >= 10, timeout=20)
        health = admin(router, "/admin/health").json()
        requests = health["files"]["requests"]
        assert health["status"] == "degraded" and not requests["ok"]
        assert requests["held"] <= 5 and "No space left on device" in requests["last_error"]
        assert metric(router, "revgate_router_requests_file_ok") == 0
        assert metric(router, "revgate_router_requests_file_failures_total") >= 2
        assert metric(router, "revgate_router_requests_file_held") <= 5
    log = (tmp_path / "router.log").read_text()
    assert "requests file /dev/full: cannot write" in log


def forge(store: RecordStore, after: ObjectName, step: int, rows: list[str], signature: str | None) -> str:
    """An object anyone with write access could add: the router's name shape, the next sequence number."""
    name = replace(after, written_ms=after.written_ms + step, sequence=after.sequence + step)
    body = "".join(row + "\n" for row in rows).encode()
    if signature is not None:
        body += json.dumps({FIELD: {"v": 1, "alg": "ed25519", "sig": signature}}).encode() + b"\n"
    store.put(name.key, body)
    return store.where(name.key)


@pytest.mark.parametrize("kind", ["folder", "s3"])
def test_a_forged_object_in_the_store_is_refused_reported_and_holds_no_stage(
    farm: UpstreamFarm, s3_endpoint: str, tmp_path: Path, kind: str
) -> None:
    # The defect: the reader believed any object under its prefix. A forged record of a real request
    # at a higher attempt replaced the real one, and an object it could not parse made the stage
    # inconclusive, so anyone who could write to the store could steer or hold every rollout.
    url = str(tmp_path / "records") if kind == "folder" else bucket_url(s3_endpoint)
    key = tmp_path / "host-a.key"
    made = subprocess.run([sys.executable, "-m", "revgate.cli.main", "router-key", str(key)], capture_output=True,
                          text=True, check=True)
    assert "BEGIN PUBLIC KEY" in made.stdout and key.stat().st_mode & 0o077 == 0
    since = time.time()
    first = snapshot(ROUTE, 1, [farm["a1"]], candidate=[farm["s1"]], weight_ppm=500_000)
    (tmp_path / "a").mkdir()
    flags = sink_flags(url, "host-a", "--records-key", str(key), "--record-outputs")
    with router_process(tmp_path / "a", ROUTE, first, extra=flags) as one:
        assert sink_health(one)["signed"]
        for number in range(100):
            complete(one, f"a{number}", **{"x-session-id": f"a{number}"})
        signers = {"host-a": f"{key}.pub"}  # the site configuration's record_signers
        stage = StageRecords(url, ROUTE, StageWindow(first_generation=1, since_s=since), paired=False,
                             signers=signers)
        wait_until(lambda: stage.poll() >= 100, timeout=20)

        store = open_record_store(url)
        prefix = f"{ROUTE}/requests/host-a/"
        last = parse_name(ROUTE, "requests", "host-a", store.files(prefix)[-1])
        assert last is not None
        victims = sorted(stage.by_id.values(), key=lambda record: record.request_id)[:2]
        rows = [replace(victim, attempt=9, outcome="error", status_code=500).to_json()
                for victim in victims]
        unsigned = forge(store, last, 1, rows[:1], None)
        invalid = forge(store, last, 2, rows[1:], base64.b64encode(bytes(64)).decode())
        for number in range(100, 120):
            complete(one, f"a{number}", **{"x-session-id": f"a{number}"})
        wait_until(lambda: stage.poll() >= 120, timeout=20)  # the router's objects after the forged ones

    assert [stage.by_id[victim.request_id] for victim in victims] == victims  # the real records are kept
    refused = "\n".join(stage.refused)
    assert f"forged {unsigned} (router host-a)" in refused and "no signature line" in refused
    assert f"forged {invalid} (router host-a)" in refused and "does not match" in refused
    assert stage.lost == [] and stage.per_router == {"host-a": 120}
    # Every answer its own reference: both revisions answer well, so the gates alone pass the stage.
    labels = {record.request_id: TraceEntry(request_id=record.caller_request_id, offset_s=0.0, body={},
                                            reference=record.output_text) for record in stage.by_id.values()}
    arms = stage.canary(fingerprint("a"), fingerprint("s"), labels)
    policy = GatePolicy.build(latency_metrics=[], quality_margin="0.1", error_margin="0.1",
                              min_samples_per_slice=20, max_samples_per_stage=40, look_every=20)
    judged = judge(gates_from_policy(policy, 0.5), policy,
                   build_evidence(arms.stable, arms.candidate, exact_match, expected_candidate_share=0.5))
    report = with_provenance(judged, arms, stage.refused)
    assert report.outcome == "pass", [(g.gate, g.outcome, g.reason) for g in judged.gates]
    assert report.outcome == judged.outcome != "inconclusive"  # reported, and holding nothing
    assert sum(note.startswith("refused as evidence: forged") for note in report.notes) == 2
