"""The worker agent with real vLLM replicas: verified start, warm-up, serving through the proxy,
kill -9 detection, tampered cache refusal, wrong token refusal, and drain with requests in flight.

One agent (the real ``revgate worker`` command) serves the whole module; two replicas start at
once, so the module pays for two vLLM starts in parallel.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from evaluation.reference_task import examples
from manifests import ExecutionConfig, InterfacePolicy, ServiceRevision
from manifests.worker import WarmProfile
from registry.build import build_manifest
from registry.runtime import engine_runtime
from registry.signing import sign_with_key
from registry.store import open_store
from serving.worker.engine import engine_python, free_port
from serving.worker.auth import write_token
from serving.worker.client import WorkerClient, WorkerUnauthorized
from serving.worker.request import ReplicaRequest
from tests.conftest import wait_for_port
from tests.integration.signing_material import write_key
from zoo.index import load_revisions

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]
TOKEN = "worker-test-token-0123456789abcdef"
START_TIMEOUT_S = 400


@dataclass(frozen=True)
class Worker:
    client: WorkerClient
    cache: Path
    process: subprocess.Popen[bytes]
    request: ReplicaRequest
    log: Path


def published_request(tmp: Path, model: Path) -> ReplicaRequest:
    """Sign and push a reference model to a filesystem store; the start request that pins it."""
    manifest = build_manifest(model)
    keys, _ = write_key(tmp / "keys", "signer")
    signature = tmp / "model.sig"
    sign_with_key(manifest, signature, keys.private)
    store = tmp / "store"
    open_store(str(store)).push(model, manifest, signature)
    revision = ServiceRevision.build(
        name="stable",
        artifact=manifest,
        runtime=engine_runtime(engine_python().parent.parent),
        execution=ExecutionConfig.build(dtype="float32", max_model_len=64, enforce_eager=True, max_num_seqs=16),
        interface=InterfacePolicy(),
    )
    warm = WarmProfile.build(prompt_lengths=[8, 24], max_tokens=16, concurrency=4, request_count=8)
    return ReplicaRequest.build(
        revision=revision, store=str(store), signature_policy={"kind": "key", "public_key": str(keys.public)},
        warm=warm,
    )


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, zoo_dir: Path) -> Iterator[Worker]:
    """The real ``revgate worker`` command on a free port, stopped (and its replicas drained) at the end."""
    tmp = tmp_path_factory.mktemp("worker")
    request = published_request(tmp, zoo_dir / load_revisions(zoo_dir)["stable"].path)
    token_file = tmp / "token"
    write_token(token_file, TOKEN)
    port = free_port()
    log = tmp / "worker.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "worker", "--port", str(port), "--cache", str(tmp / "cache"),
             "--token-file", str(token_file), "--startup-timeout", str(START_TIMEOUT_S)],
            stdout=output, stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, 60, process)
        yield Worker(WorkerClient(f"http://127.0.0.1:{port}", TOKEN), tmp / "cache", process, request, log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def completion(
    endpoint: str, model: str, max_tokens: int, stream: bool = False, prompt: str = "add 12+30="
) -> tuple[int, dict[str, str], bytes]:
    """POST /v1/completions through the replica's proxy; status, headers, body (errors included)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
            "temperature": 0}
    request = urllib.request.Request(endpoint + "/v1/completions", data=json.dumps(body).encode(),  # noqa: S310
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers.items()), error.read()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_wrong_token_is_refused_and_changes_nothing(worker: Worker) -> None:
    intruder = WorkerClient(worker.client.url, "not-the-token-at-all-000000")
    with pytest.raises(WorkerUnauthorized, match="401"):
        intruder.start(worker.request)
    with pytest.raises(WorkerUnauthorized, match="401"):
        intruder.replicas()
    assert worker.client.replicas() == []


def test_replicas_start_verified_warm_serve_die_loudly_refuse_tampering_and_drain(worker: Worker) -> None:
    client, request = worker.client, worker.request
    first = client.start(request)
    second = client.start(request)
    assert first["state"] == "created" and first["replica_id"] != second["replica_id"]
    a = client.wait_for(first["replica_id"], {"ready"}, START_TIMEOUT_S)
    b = client.wait_for(second["replica_id"], {"ready"}, START_TIMEOUT_S)
    assert (a["state"], b["state"]) == ("ready", "ready"), (a["failure"], b["failure"], worker.log.read_text()[-3000:])
    check_ready_replica(a, request)
    check_capacity(client.capacity(), request, ready=[a, b])
    check_serving(a, request)

    # kill -9 of a replica: noticed, reported with exit status and log tail, not restarted.
    os.kill(b["pid"], signal.SIGKILL)
    died = client.wait_for(b["replica_id"], {"failed"}, 30)
    assert died["state"] == "failed"
    assert died["failure"]["exit_code"] == -signal.SIGKILL
    assert died["failure"]["error"] == "ReplicaDied" and died["failure"]["log_tail"]
    assert died["probes"] == {"startup": True, "liveness": False, "readiness": False}
    time.sleep(1)
    assert [r["replica_id"] for r in client.replicas()] == [a["replica_id"], b["replica_id"]]
    assert client.replica(b["replica_id"])["state"] == "failed"
    check_capacity(client.capacity(), request, ready=[a])

    check_tampered_cache_is_refused(worker)
    check_drain_with_requests_in_flight(client, a)


def check_ready_replica(replica: dict[str, Any], request: ReplicaRequest) -> None:
    assert replica["served_model"] == f"stable@{request.revision.short}"
    assert replica["revision"] == request.revision.fingerprint
    assert replica["capacity"]["requests_per_s"] > 0 and replica["capacity"]["concurrency"] == 4
    timings = replica["timings_s"]
    assert {"fetch_s", "verify_s", "engine_start_s", "warm_s"} <= timings.keys()
    assert pid_alive(replica["pid"])
    assert replica["probes"] == {"startup": True, "liveness": True, "readiness": True}


def check_capacity(report: dict[str, Any], request: ReplicaRequest, ready: list[dict[str, Any]]) -> None:
    entry = report["revisions"][request.revision.fingerprint]
    assert entry["ready_replicas"] == len(ready)
    assert sorted(entry["ready"]) == sorted(r["replica_id"] for r in ready)
    expected = sum(r["capacity"]["requests_per_s"] for r in ready)
    assert abs(entry["requests_per_s"] - expected) < 1e-6


def check_serving(replica: dict[str, Any], request: ReplicaRequest) -> None:
    engine = f"http://127.0.0.1:{replica['engine_port']}"
    for example in examples(4, 6):
        status, headers, body = completion(replica["endpoint"], replica["served_model"], 8, prompt=example.prompt)
        assert status == 200, body
        assert headers["x-revgate-revision"] == request.revision.fingerprint
        assert json.loads(body)["usage"]["completion_tokens"] == 8
        # The proxy relays the engine's answer unchanged (greedy: the same text both ways).
        _, _, direct = completion(engine, replica["served_model"], 8, prompt=example.prompt)
        assert json.loads(body)["choices"][0]["text"] == json.loads(direct)["choices"][0]["text"]
    _, _, whole = completion(replica["endpoint"], replica["served_model"], 8, prompt=example.prompt)
    status, headers, body = completion(replica["endpoint"], replica["served_model"], 8, stream=True,
                                       prompt=example.prompt)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["x-revgate-revision"] == request.revision.fingerprint
    events = [line.removeprefix("data: ") for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) >= 2
    streamed = "".join(json.loads(event)["choices"][0]["text"] for event in events[:-1])
    assert streamed == json.loads(whole)["choices"][0]["text"]


def check_tampered_cache_is_refused(worker: Worker) -> None:
    artifact = worker.cache / "artifacts" / worker.request.manifest_digest.removeprefix("sha256:")
    config = artifact / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 1'))
    refused = worker.client.start(worker.request)
    view = worker.client.wait_for(refused["replica_id"], {"failed"}, 120)
    assert view["state"] == "failed"
    assert view["failure"]["error"] == "DigestMismatch" and "config.json" in view["failure"]["message"]
    assert view["pid"] is None and view["engine_port"] is None  # no process was started
    assert not (worker.cache / "logs" / f"{refused['replica_id']}.log").exists()
    assert not artifact.exists() and list((worker.cache / "quarantine").iterdir())


def check_drain_with_requests_in_flight(client: WorkerClient, replica: dict[str, Any]) -> None:
    endpoint, model = replica["endpoint"], replica["served_model"]
    results: list[tuple[int, dict[str, str], bytes]] = []
    threads = [threading.Thread(target=lambda: results.append(completion(endpoint, model, 48))) for _ in range(8)]
    for thread in threads:
        thread.start()
    # A request whose body never finishes arriving: in flight, and still so when the grace period ends.
    port = int(endpoint.rsplit(":", 1)[1])
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    deadline = time.monotonic() + 10
    while client.replica(replica["replica_id"])["in_flight"] < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    draining = client.drain(replica["replica_id"], grace_s=8)
    assert draining["state"] == "draining" and not draining["ready"]
    # Counted when readiness was withdrawn: the stalled request and at least one generating request.
    in_flight_at_drain = draining["in_flight"]
    assert in_flight_at_drain >= 2
    status, headers, body = completion(endpoint, model, 4)
    assert status == 503 and headers["retry-after"] == "1"
    assert "draining" in json.loads(body)["error"]["message"]
    for thread in threads:
        thread.join(120)
    assert [(status, json.loads(body)["usage"]["completion_tokens"]) for status, _, body in results] == [(200, 48)] * 8
    stalled.settimeout(30)
    answer = stalled.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 503") and "grace period of 8 s ended" in answer
    done = client.wait_for(replica["replica_id"], {"terminated"}, 60)
    drain = done["drain"]
    assert done["state"] == "terminated"
    assert (drain["completed"], drain["cancelled"]) == (in_flight_at_drain - 1, 1)
    assert drain["port_released"] and drain["memory_released"]
    assert not pid_alive(replica["pid"])
    with pytest.raises(ConnectionError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
