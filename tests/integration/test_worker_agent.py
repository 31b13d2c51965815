"""The worker agent with real vLLM replicas: verified start, warm-up, serving through the proxy,
kill -9 detection, tampered cache refusal, wrong token refusal, and drain with requests in flight;
and what a hostile client or a broken engine cannot do: reach vLLM's own API (its runtime LoRA
loading) through the proxy or from another host, change a replica's verified files, start the
artifact under another signature policy while it loads, or keep a stuck engine draining.

One agent (the real ``revgate worker`` command, on an address other than 127.0.0.1) serves the
whole module; three replicas start at once, so the module pays for three vLLM starts in parallel.
"""

from __future__ import annotations

import contextlib
import ipaddress
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from revgate.evaluation.reference_task import examples
from revgate.manifests import ExecutionConfig, InterfacePolicy, ServiceRevision
from revgate.manifests.worker import WarmProfile
from revgate.registry.build import build_manifest
from revgate.registry.runtime import engine_runtime
from revgate.registry.signing import sign_with_key
from revgate.registry.store import open_store
from revgate.serving.worker.auth import write_token
from revgate.serving.worker.client import WorkerClient, WorkerRequestFailed, WorkerUnauthorized
from revgate.serving.worker.engine import engine_python, free_port, session_members
from revgate.serving.worker.request import ReplicaRequest, SignaturePolicySpec
from revgate.serving.worker.sealed import is_read_only
from revgate.serving.worker.views import CapacityReport, ReplicaView
from revgate.zoo.index import load_revisions
from tests.integration.signing_material import write_key

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]
TOKEN = "worker-test-token-0123456789abcdef"
START_TIMEOUT_S = 400
STOP_TIMEOUT_S = 10  # the worker's --stop-timeout: SIGTERM, then SIGKILL this much later
TCP_LISTEN = "0A"  # socket state in /proc/net/tcp


@dataclass(frozen=True)
class Worker:
    client: WorkerClient
    cache: Path
    process: subprocess.Popen[bytes]
    request: ReplicaRequest
    log: Path
    host: str  # the worker's own address (its control API and proxies), never 127.0.0.1
    adapter: Path  # a LoRA adapter a hostile client might try to load at runtime
    keys: Path  # where to write another signer's key


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


def non_loopback_address() -> str:
    """An IPv4 address of this machine outside 127/8 if it has one, else 127.0.0.2 (not 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # picks the outgoing interface; nothing is sent
            address = str(probe.getsockname()[0])
        except OSError:
            address = ""
    return address if address and not address.startswith("127.") else "127.0.0.2"


def accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def listening_addresses(port: int) -> set[str]:
    """The local addresses with a listening TCP socket on ``port`` (IPv4 and IPv6), from /proc."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] == TCP_LISTEN and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                # The kernel prints each 32-bit word in host (little-endian) order.
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(str(ipaddress.ip_address(words)))
    return found


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
        # LoRA on: vLLM then offers runtime adapter loading, which only the proxy keeps from callers.
        execution=ExecutionConfig.build(dtype="float32", max_model_len=64, enforce_eager=True, max_num_seqs=16,
                                        enable_lora=True, max_lora_rank=8),
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
    revisions = load_revisions(zoo_dir)
    request = published_request(tmp, zoo_dir / revisions["stable"].path)
    token_file = tmp / "token"
    write_token(token_file, TOKEN)
    host = non_loopback_address()
    port = free_port(host)
    log = tmp / "worker.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "revgate.cli.main", "worker", "--host", host, "--port", str(port),
             "--cache", str(tmp / "cache"), "--token-file", str(token_file),
             "--startup-timeout", str(START_TIMEOUT_S), "--stop-timeout", str(STOP_TIMEOUT_S)],
            stdout=output, stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: process.poll() is not None or accepts(host, port), 60, "the worker listens")
        assert process.poll() is None, log.read_text()
        yield Worker(WorkerClient(f"http://{host}:{port}", TOKEN), tmp / "cache", process, request, log, host,
                     zoo_dir / revisions["adapter"].path, tmp / "keys")
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
    return http(endpoint + "/v1/completions", body)


def http(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET (no body) or POST JSON; status, headers, body (errors included)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})  # noqa: S310
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


def test_the_agent_names_its_engine_build_and_what_it_can_run(worker: Worker) -> None:
    # The controller pins a revision's runtime from here: it has no engine environment of its own.
    engine = worker.client.engine()
    assert engine.runtime == engine_runtime(Path(".venv-engine"))
    assert engine.runtime.device == engine.device == "cpu"
    assert 64 in engine.capabilities["head_sizes"] and "bfloat16" in engine.capabilities["dtypes"]
    with pytest.raises(WorkerUnauthorized, match="401"):
        WorkerClient(worker.client.url, "not-the-token-at-all-000000").engine()


def test_replicas_start_verified_warm_serve_die_loudly_refuse_tampering_and_drain(worker: Worker) -> None:
    client, request = worker.client, worker.request
    started = [client.start(request) for _ in range(3)]
    ids = [replica.replica_id for replica in started]
    assert started[0].state == "created" and len(set(ids)) == 3
    check_another_policy_is_refused_while_loading(worker, ids)
    a, b, c = (client.wait_for(replica_id, {"ready"}, START_TIMEOUT_S) for replica_id in ids)
    states = [(r.state, r.failure) for r in (a, b, c)]
    assert [state for state, _ in states] == ["ready"] * 3, (states, worker.log.read_text()[-3000:])
    check_ready_replica(a, request)
    check_capacity(client.capacity(), request, ready=[a, b, c])
    check_serving(a, request)
    check_engine_listens_on_loopback_only(worker, a)
    check_proxy_exposes_only_inference(worker, a, b)
    check_replica_loads_its_own_read_only_files(worker, a)
    check_replicas_take_turns_on_the_cores(worker, [a, b, c])

    # kill -9 of a replica: noticed, reported with exit status and log tail, not restarted.
    os.kill(b.pid, signal.SIGKILL)
    died = client.wait_for(b.replica_id, {"failed"}, 30)
    assert died.state == "failed"
    assert died.failure.exit_code == -signal.SIGKILL
    assert died.failure.error == "ReplicaDied" and died.failure.log_tail
    assert died.probes == {"startup": True, "liveness": False, "readiness": False}
    # Released: its folder is removed once the engine is reaped; nothing took its place.
    wait_until(lambda: not (worker.cache / "replicas" / b.replica_id).exists(), 30, "b's folder removed")
    assert [r.replica_id for r in client.replicas()] == ids
    assert client.replica(b.replica_id).state == "failed"
    check_capacity(client.capacity(), request, ready=[a, c])

    check_tampered_cache_is_refused(worker, a)
    check_a_stuck_engine_is_killed_when_draining(worker, c)
    check_drain_with_requests_in_flight(worker, a)


def engine_cores(pid: int) -> set[tuple[int, ...]]:
    """The distinct core sets the threads of the engine ``pid`` (and its children) may run on now."""
    found = set()
    for member in session_members(pid):
        for task in Path(f"/proc/{member}/task").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                found.add(tuple(sorted(os.sched_getaffinity(int(task.name)))))
    return found


def check_replicas_take_turns_on_the_cores(worker: Worker, ready: list[ReplicaView]) -> None:
    """Each engine computes on its slot's cores only (every thread, the engine's children too), and the
    ready replicas take turns on the slots: over a few turns each is seen on every slot."""
    slots = worker.client.capacity().slots
    seen: dict[str, set[tuple[int, ...]]] = {r.replica_id: set() for r in ready}

    def consistent_and_turned() -> bool:
        for replica_id, cores in seen.items():
            replica = worker.client.replica(replica_id)
            reported = tuple(replica.cpu_cores)
            if engine_cores(replica.pid) == {reported}:  # between a move and its report they differ
                cores.add(reported)
        return all(len(cores) == min(slots, len(ready)) for cores in seen.values())

    if slots < 2:  # one slot: every engine binds to all of this host's cores and nothing takes turns
        assert all(engine_cores(r.pid) == {tuple(sorted(os.sched_getaffinity(0)))} for r in ready)
        return
    wait_until(consistent_and_turned, 60, f"every replica seen bound to each of the {slots} slots ({seen})")


def check_another_policy_is_refused_while_loading(worker: Worker, loading: list[str]) -> None:
    """A start of the same artifact under another signer's key, while it loads: refused, nothing moved."""
    other, _ = write_key(worker.keys, "other-signer")
    policy = SignaturePolicySpec(kind="key", public_key=str(other.public))
    assert {worker.client.replica(replica_id).state for replica_id in loading} <= {"created", "loading"}
    with pytest.raises(WorkerRequestFailed, match="409: SignaturePolicyConflict") as refused:
        worker.client.start(worker.request.model_copy(update={"signature_policy": policy}))
    assert "same signature policy" in refused.value.fix
    assert [r.replica_id for r in worker.client.replicas()] == loading
    assert not (worker.cache / "quarantine").exists()


def check_engine_listens_on_loopback_only(worker: Worker, replica: ReplicaView) -> None:
    """vLLM's own port answers on 127.0.0.1 only; the worker's address reaches the proxy alone."""
    engine_port = replica.engine_port
    assert listening_addresses(engine_port) == {"127.0.0.1"}
    assert not accepts(worker.host, engine_port)
    assert replica.endpoint.startswith(f"http://{worker.host}:")
    assert http(replica.endpoint + "/v1/models")[0] == 200


def model_ids(url: str) -> list[str]:
    status, _, body = http(url + "/v1/models")
    assert status == 200, body
    return sorted(model["id"] for model in json.loads(body)["data"])


def check_proxy_exposes_only_inference(worker: Worker, replica: ReplicaView, other: ReplicaView) -> None:
    """Runtime LoRA loading works on the engine itself (shown on ``other``), never through a proxy."""
    load = {"lora_name": "smuggled", "lora_path": str(worker.adapter)}
    engine = f"http://127.0.0.1:{other.engine_port}"
    status, _, body = http(engine + "/v1/load_lora_adapter", load)
    assert status == 200 and "smuggled" in model_ids(engine), body  # the door the proxy keeps shut

    before = model_ids(replica.endpoint)
    for path, payload in (("/v1/load_lora_adapter", load), ("/v1/unload_lora_adapter", {"lora_name": "x"}),
                          ("/tokenize", {"model": replica.served_model, "prompt": "a"}),
                          ("/v1/completions/../load_lora_adapter", load)):
        status, headers, body = http(replica.endpoint + path, payload)
        error = json.loads(body)["error"]
        assert (status, error["type"]) == (404, "not_found"), body
        assert "is not exposed by the replica proxy" in error["message"]
        assert headers["x-revgate-revision"] == replica.revision
    assert model_ids(replica.endpoint) == before == [replica.served_model]
    # The count drops when the proxy's task for the request ends, just after its answer is written: polled.
    wait_until(lambda: worker.client.replica(replica.replica_id).in_flight == 0, 30,
               "no refused request left in the replica's in-flight count")


def check_replica_loads_its_own_read_only_files(worker: Worker, replica: ReplicaView) -> None:
    """The engine loads the replica's folder: read-only hard links to the verified cache entry."""
    folder = worker.cache / "replicas" / replica.replica_id
    entry = worker.cache / "artifacts" / worker.request.manifest_digest.removeprefix("sha256:")
    command = Path(f"/proc/{replica.pid}/cmdline").read_bytes().split(b"\0")
    assert command[command.index(b"--model") + 1].decode() == str(folder)
    assert is_read_only(folder) and is_read_only(entry)
    for file in entry.iterdir():
        assert (folder / file.name).stat().st_ino == file.stat().st_ino  # linked, not copied


def check_ready_replica(replica: ReplicaView, request: ReplicaRequest) -> None:
    assert replica.served_model == f"stable@{request.revision.short}"
    assert replica.revision == request.revision.fingerprint
    assert replica.capacity.requests_per_s > 0 and replica.capacity.concurrency == 4
    timings = replica.timings_s
    assert {"fetch_s", "verify_s", "engine_start_s", "warm_s"} <= timings.keys()
    assert pid_alive(replica.pid)
    assert replica.probes == {"startup": True, "liveness": True, "readiness": True}


def check_capacity(report: CapacityReport, request: ReplicaRequest, ready: list[ReplicaView]) -> None:
    entry = report.revisions[request.revision.fingerprint]
    assert entry.ready_replicas == len(ready)
    assert sorted(entry.ready) == sorted(r.replica_id for r in ready)
    expected = sum(r.capacity.requests_per_s for r in ready)
    assert abs(entry.requests_per_s - expected) < 1e-6
    # By endpoint, so a controller counts only the replicas its route sends to.
    assert entry.ready_endpoints == {r.endpoint: r.capacity.requests_per_s for r in ready}


def check_serving(replica: ReplicaView, request: ReplicaRequest) -> None:
    engine = f"http://127.0.0.1:{replica.engine_port}"
    for example in examples(4, 6):
        status, headers, body = completion(replica.endpoint, replica.served_model, 8, prompt=example.prompt)
        assert status == 200, body
        assert headers["x-revgate-revision"] == request.revision.fingerprint
        assert json.loads(body)["usage"]["completion_tokens"] == 8
        # The proxy relays the engine's answer unchanged (greedy: the same text both ways).
        _, _, direct = completion(engine, replica.served_model, 8, prompt=example.prompt)
        assert json.loads(body)["choices"][0]["text"] == json.loads(direct)["choices"][0]["text"]
    _, _, whole = completion(replica.endpoint, replica.served_model, 8, prompt=example.prompt)
    status, headers, body = completion(replica.endpoint, replica.served_model, 8, stream=True,
                                       prompt=example.prompt)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["x-revgate-revision"] == request.revision.fingerprint
    events = [line.removeprefix("data: ") for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) >= 2
    streamed = "".join(json.loads(event)["choices"][0]["text"] for event in events[:-1])
    assert streamed == json.loads(whole)["choices"][0]["text"]


def check_tampered_cache_is_refused(worker: Worker, serving: ReplicaView) -> None:
    """A cache file replaced after verification: the next start refuses it; a serving replica keeps its files."""
    artifact = worker.cache / "artifacts" / worker.request.manifest_digest.removeprefix("sha256:")
    config = artifact / "config.json"
    loaded = worker.cache / "replicas" / serving.replica_id / "config.json"
    verified = loaded.read_bytes()
    artifact.chmod(0o755)  # what a writer allowed to change the read-only folder does first
    partial = artifact / ".config.json.new"
    partial.write_text(config.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 1'))
    os.replace(partial, config)
    assert loaded.read_bytes() == verified
    refused = worker.client.start(worker.request)
    view = worker.client.wait_for(refused.replica_id, {"failed"}, 120)
    assert view.state == "failed"
    assert view.failure.error == "DigestMismatch" and "config.json" in view.failure.message
    assert view.pid is None and view.engine_port is None  # no process was started
    assert not (worker.cache / "logs" / f"{refused.replica_id}.log").exists()
    assert not artifact.exists() and list((worker.cache / "quarantine").iterdir())
    assert loaded.read_bytes() == verified and not (worker.cache / "replicas" / refused.replica_id).exists()


def check_a_stuck_engine_is_killed_when_draining(worker: Worker, replica: ReplicaView) -> None:
    """An engine that ignores SIGTERM (stopped): killed after the grace period and the stop timeout."""
    client, replica_id = worker.client, replica.replica_id
    os.kill(replica.pid, signal.SIGSTOP)
    answers: list[tuple[int, dict[str, str], bytes]] = []
    request = threading.Thread(target=lambda: answers.append(completion(replica.endpoint,
                                                                         replica.served_model, 8)))
    request.start()
    wait_until(lambda: client.replica(replica_id).in_flight == 1, 30, "a request in flight to the stuck engine")
    began = time.monotonic()
    client.drain(replica_id, grace_s=1)
    done = client.wait_for(replica_id, {"terminated"}, 120)
    took = time.monotonic() - began
    request.join(30)
    drain = done.drain
    assert drain is not None, done
    assert done.state == "terminated", done
    assert drain.killed and f"did not exit within {STOP_TIMEOUT_S} s of SIGTERM" in drain.stop_reason
    assert drain.process_exit_code == -signal.SIGKILL
    assert drain.port_released and drain.memory_released and not pid_alive(replica.pid)
    assert took >= 1 + STOP_TIMEOUT_S  # the grace period and the SIGTERM wait both came first
    assert drain.cancelled == 1
    status, _, body = answers[0]
    assert status == 503 and "grace period of 1 s ended" in json.loads(body)["error"]["message"]
    assert not (worker.cache / "replicas" / replica_id).exists()


def check_drain_with_requests_in_flight(worker: Worker, replica: ReplicaView) -> None:
    client, endpoint, model = worker.client, replica.endpoint, replica.served_model
    results: list[tuple[int, dict[str, str], bytes]] = []
    threads = [threading.Thread(target=lambda: results.append(completion(endpoint, model, 48))) for _ in range(8)]
    for thread in threads:
        thread.start()
    # A request whose body never finishes arriving: in flight, and still so when the grace period ends.
    port = int(endpoint.rsplit(":", 1)[1])
    stalled = socket.create_connection((worker.host, port))
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    wait_until(lambda: client.replica(replica.replica_id).in_flight >= 3, 30, "requests in flight")
    draining = client.drain(replica.replica_id, grace_s=8)
    assert draining.state == "draining" and not draining.ready
    # Counted when readiness was withdrawn: the stalled request and at least one generating request.
    in_flight_at_drain = draining.in_flight
    assert in_flight_at_drain >= 2
    status, headers, body = completion(endpoint, model, 4)
    assert status == 503 and headers["retry-after"] == "1"
    assert "draining" in json.loads(body)["error"]["message"]
    for thread in threads:
        thread.join(120)
    # Every request the replica took before the drain finished whole; one that reached it after (a thread
    # slow to start on a busy machine) was refused as draining, never cut short.
    finished = [json.loads(body)["usage"]["completion_tokens"] for status, _, body in results if status == 200]
    refused = [json.loads(body)["error"]["message"] for status, _, body in results if status != 200]
    assert finished == [48] * len(finished) and len(finished) >= in_flight_at_drain - 1, results
    assert len(results) == 8 and all("draining" in message for message in refused), results
    stalled.settimeout(30)
    answer = stalled.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 503") and "grace period of 8 s ended" in answer
    done = client.wait_for(replica.replica_id, {"terminated"}, 60)
    drain = done.drain
    assert drain is not None, done
    assert done.state == "terminated"
    assert (drain.completed, drain.cancelled) == (in_flight_at_drain - 1, 1)
    assert drain.port_released and drain.memory_released
    assert not pid_alive(replica.pid) and not drain.killed and drain.stop_reason == ""
    assert not (worker.cache / "replicas" / replica.replica_id).exists()
    with pytest.raises(ConnectionError):
        socket.create_connection((worker.host, port), timeout=2)
