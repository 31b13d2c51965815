"""Worker agent logic without servers: lifecycle, warm profile, admission and drain, proxy framing,
auth, capacity report, and the engine command a CPU or GPU worker builds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import MutableMapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from revgate.manifests import ArtifactManifest, ExecutionConfig, InterfacePolicy, ManifestInvalid, RuntimeEnvironment
from revgate.manifests.revision import ServiceRevision
from revgate.manifests.worker import WarmProfile
from revgate.serving.worker.agent import SignaturePolicyConflict, WorkerAgent, served_model_name
from revgate.serving.worker.api import ControlApp
from revgate.serving.worker.artifact import SealedArtifact
from revgate.serving.worker.auth import TokenFileInvalid, authorized, load_token, write_token
from revgate.serving.worker.cores import bind_mask, least_used, moved_affinity, next_turn, split_cores
from revgate.serving.worker.drain import Admission
from revgate.serving.worker.engine import EngineProcess, free_port, move_session_threads
from revgate.serving.worker.proxy import (
    REVISION_HEADER,
    BadRequest,
    ReplicaProxy,
    not_exposed,
    refusal_response,
    tagged_response_head,
    upstream_request,
)
from revgate.serving.worker.report import capacity_report
from revgate.serving.worker.request import ReplicaRequest, SignaturePolicySpec
from revgate.serving.worker.state import (
    TERMINAL,
    TRANSITIONS,
    Capacity,
    IllegalTransition,
    Replica,
    ReplicaState,
)
from revgate.serving.worker.warm import (
    WarmResult,
    WarmupFailed,
    capacity_of,
    check_results,
    parse_response,
    warm_prompt,
)

S = ReplicaState
POLICY = {"kind": "key", "public_key": "/etc/revgate/signer.pub"}


def revision(execution: ExecutionConfig | None = None) -> ServiceRevision:
    return ServiceRevision.build(
        name="tiny",
        artifact=ArtifactManifest.build(
            entries=[{"path": "config.json", "size": 3, "sha256": "b" * 64, "role": "config"}]
        ),
        runtime=RuntimeEnvironment.build(
            engine_distribution="vllm", engine_version="0.32.0", torch_version="2.13.0",
            device="cuda", lock_digest="sha256:" + "c" * 64,
        ),
        execution=execution or ExecutionConfig(),
        interface=InterfacePolicy(),
    )


# ----- lifecycle


def test_the_happy_path_and_drain_are_allowed_in_order() -> None:
    replica = Replica("r-1", "sha256:" + "0" * 64, "tiny@000000000000")
    for target in (S.LOADING, S.WARMING, S.READY, S.DRAINING, S.TERMINATED):
        replica = replica.moved_to(target)
    assert replica.state is S.TERMINATED


def test_readiness_cannot_skip_warm_up_and_terminal_states_are_final() -> None:
    loading = Replica("r-1", "rev", "m").moved_to(S.LOADING)
    with pytest.raises(IllegalTransition, match="from loading to ready") as caught:
        loading.moved_to(S.READY)
    assert "warming" in caught.value.fix
    assert loading.state is S.LOADING  # nothing changed
    assert {S.TERMINATED, S.FAILED} == TERMINAL
    for state in TERMINAL:
        with pytest.raises(IllegalTransition, match="terminal"):
            Replica("r", "rev", "m", state=state).moved_to(S.LOADING)


def test_every_live_state_can_fail_and_only_ready_is_ready() -> None:
    for state, targets in TRANSITIONS.items():
        if state not in TERMINAL and state is not S.CREATED:
            assert S.FAILED in targets
        assert Replica("r", "rev", "m", state=state).is_ready == (state is S.READY)


# ----- warm profile


def test_warm_profile_cycles_shapes_and_refuses_what_does_not_fit() -> None:
    profile = WarmProfile.build(prompt_lengths=[4, 64], max_tokens=8, request_count=5)
    assert profile.request_lengths() == (4, 64, 4, 64, 4)
    profile.check_fits(72)
    with pytest.raises(ManifestInvalid, match="72 tokens exceeds max_model_len 64"):
        profile.check_fits(64)
    with pytest.raises(ManifestInvalid, match="some shapes never run"):
        WarmProfile.build(prompt_lengths=[1, 2, 3], request_count=2)
    with pytest.raises(ManifestInvalid, match="prompt_lengths"):
        WarmProfile.build(prompt_lengths=[])


def test_warm_prompts_have_the_exact_length_and_stay_in_the_vocabulary() -> None:
    for vocab in (259, 32_000, 128_256):
        prompt = warm_prompt(100, vocab, seed=3)
        assert len(prompt) == 100
        assert all(vocab // 4 <= token < vocab // 2 for token in prompt)


def test_warm_up_fails_on_any_failed_request_and_measures_capacity() -> None:
    ok = [WarmResult(200, 16)] * 3
    assert capacity_of(ok, 2.0, 4) == Capacity(1.5, 24.0, 4)
    with pytest.raises(WarmupFailed, match="1 of 4 warm-up requests failed; first: status 400, too long"):
        check_results([*ok, WarmResult(400, 0, "too long")], "r-1")


def test_response_parsing_decodes_chunked_bodies() -> None:
    raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n"
    assert parse_response(raw) == (200, b'{"a":1}')
    assert parse_response(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}") == (503, b"{}")


# ----- admission and drain


def test_drain_lets_in_flight_requests_finish_refuses_new_and_cancels_late_ones() -> None:
    async def scenario() -> None:
        admission = Admission("r-1")
        assert admission.refusal() is not None  # not ready: nothing admitted
        admission.open()
        assert admission.refusal() is None

        async def request(seconds: float) -> None:
            task = asyncio.current_task()
            assert task is not None
            admission.enter(task)  # type: ignore[arg-type]
            try:
                await asyncio.sleep(seconds)
            finally:
                admission.leave(task)  # type: ignore[arg-type]

        quick = [asyncio.create_task(request(0.05)) for _ in range(3)]
        slow = asyncio.create_task(request(30))
        await asyncio.sleep(0.01)
        assert admission.in_flight == 4
        outcome = await admission.drain(0.5, "replica r-1 is draining")
        refusal = admission.refusal()
        assert refusal is not None and "draining" in refusal.reason
        assert (outcome.completed, outcome.cancelled) == (3, 1)
        assert "grace period of 0.5 s ended" in outcome.cancel_reason
        assert all(task.done() and not task.cancelled() for task in quick)
        assert slow.cancelled()
        assert admission.in_flight == 0
        assert outcome.waited_s < 5

    asyncio.run(scenario())


def test_drain_with_nothing_in_flight_returns_at_once() -> None:
    admission = Admission("r-2")
    admission.open()
    outcome = asyncio.run(admission.drain(30, "draining"))
    assert (outcome.completed, outcome.cancelled, outcome.cancel_reason) == (0, 0, "")
    assert outcome.waited_s < 1


# ----- proxy framing


def test_upstream_request_replaces_hop_by_hop_headers() -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n"
    request, length = upstream_request(head, b"{}")
    assert length == 2
    text = request.decode()
    assert text.startswith("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n")
    assert "keep-alive" not in text and text.endswith("Connection: close\r\n\r\n{}")
    with pytest.raises(BadRequest, match="chunked"):
        upstream_request(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"")
    with pytest.raises(BadRequest, match="malformed request line"):
        upstream_request(b"garbage\r\n\r\n", b"")


def test_the_proxy_exposes_only_the_openai_inference_paths() -> None:
    for method, target in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions?x=1"),
                           ("GET", "/v1/models"), ("GET", "/health")):
        assert not_exposed(f"{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()) is None
    for method, target in (("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"),
                           ("POST", "/tokenize"), ("GET", "/metrics"), ("GET", "/v1/completions"),
                           ("POST", "/v1/completions/../load_lora_adapter"), ("POST", "/v1/%63ompletions"),
                           ("POST", "http://engine/v1/completions"), ("POST", "/V1/completions")):
        reason = not_exposed(f"{method} {target} HTTP/1.1\r\n\r\n".encode())
        assert reason is not None and f"{method} {target} is not exposed" in reason
        assert "POST /v1/completions" in reason


def test_responses_carry_the_revision_and_refusals_a_retry_signal() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: keep-alive\r\n\r\n"
    tagged = tagged_response_head(head, "sha256:abc", "r-1").decode()
    assert f"{REVISION_HEADER}: sha256:abc\r\n" in tagged and "keep-alive" not in tagged
    assert tagged.endswith("connection: close\r\n\r\n")
    admission = Admission("r-1")
    admission.close("replica r-1 is draining; retry on another replica")
    refusal = admission.refusal()
    assert refusal is not None
    raw = refusal_response(refusal, "sha256:abc")
    status, body = parse_response(raw)
    assert status == 503 and b"retry-after: 1\r\n" in raw
    assert json.loads(body)["error"]["message"] == "replica r-1 is draining; retry on another replica"


# ----- auth


def test_token_is_compared_exactly_and_token_files_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "token"
    write_token(path, "s3cret-token-0123456789")
    token = load_token(path)
    assert authorized("Bearer s3cret-token-0123456789", token)
    for wrong in (None, "", "s3cret-token-0123456789", "Bearer s3cret-token-012345678", "Basic x"):
        assert not authorized(wrong, token)
    path.chmod(0o644)
    with pytest.raises(TokenFileInvalid, match="readable by other users"):
        load_token(path)
    write_token(tmp_path / "short", "abc")
    with pytest.raises(TokenFileInvalid, match="shorter than 16"):
        load_token(tmp_path / "short")
    with pytest.raises(TokenFileInvalid, match="cannot read"):
        load_token(tmp_path / "missing")


# ----- capacity


def test_capacity_counts_only_ready_replicas_and_lists_the_rest() -> None:
    ready = Capacity(10.0, 160.0, 4)
    replicas = [
        Replica("a-1", "rev-a", "m", state=S.READY, capacity=ready),
        Replica("a-2", "rev-a", "m", state=S.READY, capacity=Capacity(5.0, 80.0, 4)),
        Replica("a-3", "rev-a", "m", state=S.WARMING),
        Replica("a-4", "rev-a", "m", state=S.DRAINING, capacity=ready),
        Replica("b-1", "rev-b", "m", state=S.LOADING),
        Replica("b-2", "rev-b", "m", state=S.FAILED),
        Replica("c-1", "rev-c", "m", state=S.TERMINATED, capacity=ready),
    ]
    report = capacity_report(replicas)["revisions"]
    assert set(report) == {"rev-a", "rev-b"}
    assert report["rev-a"]["ready_replicas"] == 2
    assert report["rev-a"]["requests_per_s"] == 15.0
    assert report["rev-a"]["output_tokens_per_s"] == 240.0
    assert (report["rev-a"]["warming"], report["rev-a"]["draining"]) == (["a-3"], ["a-4"])
    assert report["rev-b"]["ready_replicas"] == 0 and report["rev-b"]["loading"] == ["b-1"]
    # Room for more: live replicas (ready, warming, loading) take a slot; draining, failed and ended ones do not.
    room = capacity_report(replicas, device="cpu", slots=6)
    assert (room["device"], room["slots"], room["free_slots"]) == ("cpu", 6, 2)
    assert capacity_report(replicas, slots=2)["free_slots"] == 0


# ----- served name and engine command


def test_served_model_name_carries_the_revision_fingerprint() -> None:
    request = ReplicaRequest.build(revision=revision(), store="/tmp/store", signature_policy=POLICY)
    assert served_model_name(request) == f"tiny@{request.revision.short}"
    assert request.manifest_digest == request.revision.artifact.digest


def test_a_gpu_worker_starts_gpu_vllm_with_the_execution_settings(tmp_path: Path) -> None:
    execution = ExecutionConfig.build(
        tensor_parallel_size=2, gpu_memory_utilization=Decimal("0.85"), max_model_len=4096, dtype="bfloat16"
    )
    request = ReplicaRequest.build(revision=revision(execution), store="s3://b/p", signature_policy=POLICY)
    agent = WorkerAgent(tmp_path, device="cuda", engine_python=Path("/opt/gpu-engine/bin/python"))
    engine = agent.engine_for(request, tmp_path / "model", tmp_path / "log")
    command = engine.command

    def flag(name: str) -> str:
        return command[command.index(name) + 1]

    assert command[:3] == ["/opt/gpu-engine/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert (flag("--tensor-parallel-size"), flag("--gpu-memory-utilization")) == ("2", "0.85")
    assert flag("--dtype") == "bfloat16"
    assert flag("--max-model-len") == "4096" and flag("--port") == str(engine.port)
    assert flag("--served-model-name") == f"tiny@{request.revision.short}"
    assert "--distributed-executor-backend" not in command  # the CPU-only single-process setting
    assert "VLLM_TARGET_DEVICE" not in engine.env
    cpu_request = ReplicaRequest.build(revision=revision(), store="s", signature_policy=POLICY)
    cpu = WorkerAgent(tmp_path, device="cpu").engine_for(cpu_request, tmp_path / "model", tmp_path / "log")
    assert cpu.env["VLLM_TARGET_DEVICE"] == "cpu" and "--kv-cache-memory-bytes" in cpu.command


def test_the_engine_listens_on_loopback_whatever_address_the_worker_serves_on(tmp_path: Path) -> None:
    request = ReplicaRequest.build(revision=revision(), store="s", signature_policy=POLICY)
    for host in ("0.0.0.0", "192.0.2.2", "::"):  # noqa: S104 - the worker's address, not the engine's
        engine = WorkerAgent(tmp_path, host=host).engine_for(request, tmp_path / "model", tmp_path / "log")
        assert engine.command[engine.command.index("--host") + 1] == "127.0.0.1"
        assert engine.host == "127.0.0.1" and engine.url == f"http://127.0.0.1:{engine.port}"


# ----- control API (the ASGI app called directly: no server, no engine)


def call_api(app: ControlApp, method: str, path: str, token: str | None, body: bytes = b"") -> tuple[int, Any]:
    return asyncio.run(call_api_async(app, method, path, token, body))


async def call_api_async(
    app: ControlApp, method: str, path: str, token: str | None, body: bytes = b""
) -> tuple[int, Any]:
    sent: list[dict[str, Any]] = []
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    await app(scope, receive, send)
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_control_api_refuses_a_wrong_token_before_doing_anything(tmp_path: Path) -> None:
    agent = WorkerAgent(tmp_path, preparer=lambda request, cache, into=None: pytest.fail("nothing may be prepared"))
    app = ControlApp(agent, "the-right-token-0123456789")
    body = ReplicaRequest.build(revision=revision(), store="s", signature_policy=POLICY).canonical()
    for token in (None, "the-wrong-token-0123456789"):
        status, answer = call_api(app, "POST", "/v1/replicas", token, body)
        assert status == 401 and answer["error"]["type"] == "Unauthorized"
    assert agent.replicas() == []
    assert call_api(app, "GET", "/healthz", None)[0] == 200


def test_control_api_names_bad_requests_and_unknown_replicas(tmp_path: Path) -> None:
    app = ControlApp(WorkerAgent(tmp_path), "the-right-token-0123456789")
    token = "the-right-token-0123456789"
    status, answer = call_api(app, "POST", "/v1/replicas", token, b'{"store": "s"}')
    assert status == 400 and answer["error"]["type"] == "ManifestInvalid" and "revision" in answer["error"]["message"]
    status, answer = call_api(app, "GET", "/v1/replicas/nope-1", token)
    assert status == 404 and answer["error"]["type"] == "UnknownReplica"
    slots = len(split_cores(sorted(os.sched_getaffinity(0)), 2))
    assert call_api(app, "GET", "/v1/capacity", token) == (
        200, {"revisions": {}, "device": "cpu", "slots": slots, "free_slots": slots})
    assert call_api(app, "DELETE", "/v1/replicas", token)[0] == 404


def test_another_signature_policy_is_refused_while_the_artifact_loads(tmp_path: Path) -> None:
    loading = threading.Event()
    release = threading.Event()

    def preparer(request: ReplicaRequest, cache: Path, into: Path | None = None) -> SealedArtifact:
        loading.set()
        release.wait(30)
        raise ManifestInvalid("stand-in for a failed fetch", where="store")

    async def scenario() -> None:
        agent = WorkerAgent(tmp_path, preparer=preparer)
        request = ReplicaRequest.build(revision=revision(), store="s", signature_policy=POLICY)
        policy = SignaturePolicySpec(kind="key", public_key="/etc/revgate/other.pub")
        other = request.model_copy(update={"signature_policy": policy})
        first = agent.start(request)
        await asyncio.to_thread(loading.wait, 30)
        with pytest.raises(SignaturePolicyConflict, match=f"replica {first.replica_id} is loading"):
            agent.start(other)
        app = ControlApp(agent, "the-right-token-0123456789")
        status, answer = await call_api_async(app, "POST", "/v1/replicas", "the-right-token-0123456789",
                                              other.canonical())
        assert status == 409 and answer["error"]["type"] == "SignaturePolicyConflict"
        assert [replica.replica_id for replica in agent.replicas()] == [first.replica_id]
        second = agent.start(request)  # the same policy shares the load
        release.set()

        async def both_failed() -> None:
            while {agent.replica(r.replica_id).state for r in (first, second)} != {S.FAILED}:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(both_failed(), 30)
        failure = agent.replica(first.replica_id).failure
        assert failure is not None and failure.error == "ManifestInvalid"
        agent.start(other)  # nothing loads it any more
        await agent.close()

    asyncio.run(scenario())


def test_a_refused_request_with_a_body_still_gets_its_answer(tmp_path: Path) -> None:
    """Answering before the body is read must not reset the connection and lose the answer."""

    def send(port: int, path: str) -> bytes:
        body = b"x" * (512 * 1024)
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            client.sendall(head + body)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
            return answer

    async def scenario() -> list[bytes]:
        proxy = ReplicaProxy(Admission("r-1"), "sha256:abc", upstream_port=1)  # not ready: nothing upstream
        port = await proxy.start()
        try:
            return [await asyncio.to_thread(send, port, path)
                    for path in ("/v1/load_lora_adapter", "/v1/completions") for _ in range(3)]
        finally:
            await proxy.close()

    answers = asyncio.run(scenario())
    assert [answer.split(b"\r\n", 1)[0] for answer in answers] == (
        [b"HTTP/1.1 404 Not Found"] * 3 + [b"HTTP/1.1 503 Service Unavailable"] * 3)
    assert b"is not exposed by the replica proxy" in answers[0] and b"not ready yet" in answers[-1]


def test_cores_split_into_near_equal_contiguous_slots_and_the_least_used_slot_is_given() -> None:
    assert split_cores([3, 0, 1, 2], 2) == ((0, 1), (2, 3))
    assert split_cores(range(5), 2) == ((0, 1, 2), (3, 4))
    assert split_cores([0, 1], 4) == ((0,), (1,))  # never an empty slot
    assert split_cores([0, 1], 0) == () and split_cores([], 2) == ()
    slots = split_cores([0, 1], 2)
    assert least_used(slots, {}) == 0 and least_used(slots, {0: 1}) == 1
    assert least_used(slots, {0: 1, 1: 1}) == 0  # a third replica shares the first slot
    assert least_used((), {}) is None
    assert bind_mask((2, 3)) == "2,3"


def test_replicas_take_turns_on_slots_of_their_size_and_a_moved_thread_keeps_its_place_in_the_slot() -> None:
    two = ((0,), (1,))
    assert next_turn({"stable": 0, "candidate": 1}, two) == {"stable": 1, "candidate": 0}
    assert next_turn({"a": 0, "b": 1, "c": 0}, two) == {"a": 1, "b": 0, "c": 1}  # a shared slot moves as one
    assert next_turn({"alone": 1}, two) == {"alone": 1}
    assert next_turn({}, two) == {}
    three = ((0, 1), (2, 3), (4,))  # only slots of one size trade places: an engine keeps its thread count
    assert next_turn({"a": 0, "b": 1, "c": 2}, three) == {"a": 1, "b": 0, "c": 2}
    held = {"a": 0, "b": 1, "c": 2}
    slots = ((0,), (1,), (2,))
    after = held
    for _ in range(3):  # three turns bring every replica back where it started, each slot held once per turn
        after = next_turn(after, slots)
        assert sorted(after.values()) == [0, 1, 2]
    assert after == held
    assert moved_affinity(frozenset({2}), (2, 3), (0, 1)) == {0}
    assert moved_affinity(frozenset({2, 3}), (2, 3), (0, 1)) == {0, 1}
    assert moved_affinity(frozenset({0, 1, 2, 3}), (2, 3), (0, 1)) is None  # floats over the host: stays
    assert moved_affinity(frozenset(), (2, 3), (0, 1)) is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="moving between cores needs two of them")
def test_an_engine_process_starts_on_its_cores_and_its_threads_move_to_the_next_slot(tmp_path: Path) -> None:
    first, second = sorted(os.sched_getaffinity(0))[:2]
    script = "import threading; threading.Thread(target=threading.Event().wait).start(); threading.Event().wait()"
    engine = EngineProcess([sys.executable, "-c", script], dict(os.environ), free_port(), log_path=tmp_path / "log",
                           cores=(first,))
    engine.start()
    try:
        pid = engine.pid
        assert pid is not None

        def threads_on(core: int) -> bool:
            tasks = [int(t.name) for t in Path(f"/proc/{pid}/task").glob("[0-9]*")]
            return len(tasks) == 2 and all(os.sched_getaffinity(t) == {core} for t in tasks)

        deadline = time.monotonic() + 30  # until the child has started its second thread
        while not threads_on(first):
            assert time.monotonic() < deadline, "the child never ran two threads on its core"
        assert move_session_threads(pid, (first,), (second,)) == 2
        assert threads_on(second)
        assert move_session_threads(pid, (first,), (second,)) == 0  # nothing bound there any more
    finally:
        engine.stop(grace=5)


def test_on_the_cpu_an_engine_is_bound_to_its_slot_and_on_a_gpu_it_is_not(tmp_path: Path) -> None:
    request = ReplicaRequest.build(revision=revision(), store="s", signature_policy=POLICY)
    agent = WorkerAgent(tmp_path, device="cpu")
    assert agent.slots == split_cores(sorted(os.sched_getaffinity(0)), 2)
    bound = agent.engine_for(request, tmp_path / "model", tmp_path / "log", cores=(1,))
    assert bound.env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and bound.cores == (1,)
    unbound = agent.engine_for(request, tmp_path / "model", tmp_path / "log")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in unbound.env or unbound.env["VLLM_CPU_OMP_THREADS_BIND"] == os.environ.get(
        "VLLM_CPU_OMP_THREADS_BIND")
    assert WorkerAgent(tmp_path, device="cuda").slots == ()
    assert WorkerAgent(tmp_path, device="cpu", cpu_slots=0).slots == ()


def test_the_replica_proxy_times_out_slow_heads_and_bodies_and_cuts_off_a_caller_who_never_reads() -> None:
    # The defect: no head or body timeout (a caller held a connection and a task for ever) and a
    # caller who never read held the relay in drain() for ever, with the engine's answer behind it.
    answer_bytes = 8 * 1024 * 1024

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the far side: a big answer to anything
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % answer_bytes)
        with contextlib.suppress(ConnectionError):
            for _ in range(answer_bytes // 65536):
                writer.write(b"x" * 65536)
                await writer.drain()
        writer.close()

    def answer_to(port: int, data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            client.sendall(data)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
            return answer

    def never_reads(port: int, done: threading.Event) -> None:
        """Ask for the big answer and read none of it, holding the connection open until ``done``."""
        with socket.socket() as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(("127.0.0.1", port))
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            done.wait(60)

    async def until(condition: Any, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return True
            await asyncio.sleep(0.05)
        return False

    async def scenario() -> tuple[bytes, bytes, bool, int]:
        server = await asyncio.start_server(engine, "127.0.0.1", 0)
        engine_port = server.sockets[0].getsockname()[1]
        admission = Admission("r-1")
        admission.open()
        proxy = ReplicaProxy(admission, "sha256:abc", engine_port, head_timeout_s=0.5, body_timeout_s=0.5,
                             write_stall_timeout_s=1.0)
        port = await proxy.start()
        try:
            half_head = await asyncio.to_thread(answer_to, port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            half_body = await asyncio.to_thread(
                answer_to, port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            done = threading.Event()
            holder = threading.Thread(target=never_reads, args=(port, done), daemon=True)
            holder.start()
            admitted = await until(lambda: admission.in_flight == 1, 20)
            cut = admitted and await until(lambda: admission.in_flight == 0, 20)  # the relay ended
            done.set()
            return half_head, half_body, cut, admission.in_flight
        finally:
            await proxy.close()
            server.close()

    half_head, half_body, cut, in_flight = asyncio.run(scenario())
    assert half_head.startswith(b"HTTP/1.1 408") and b"request head not complete within 0.5 s" in half_head
    assert half_body.startswith(b"HTTP/1.1 408") and b"request body not complete within 0.5 s" in half_body
    assert cut, "the proxy kept relaying to a caller who never read"
    assert in_flight == 0


def test_an_agents_engine_report_is_parsed_strictly() -> None:
    from revgate.manifests.revision import RuntimeEnvironment
    from revgate.registry.compat import GPU_ENGINE
    from revgate.serving.worker.client import AgentEngine, WorkerRequestFailed
    from revgate.serving.worker.report import engine_report

    runtime = RuntimeEnvironment(engine_distribution="vllm", engine_version="0.11.0", torch_version="2.8.0",
                                 device="cuda", lock_digest="sha256:" + "a" * 64)
    report = engine_report(runtime, GPU_ENGINE, device="cuda", slots=8, memory_bytes=1 << 40)
    engine = AgentEngine.from_report(json.loads(json.dumps(report)), url="http://gpu-1:9000")
    assert (engine.url, engine.runtime, engine.device) == ("http://gpu-1:9000", runtime, "cuda")
    assert engine.capabilities["head_sizes"] == sorted(GPU_ENGINE.head_sizes)
    for broken in ({**report, "runtime": {"engine": "vllm"}}, {"device": "cuda"}):
        with pytest.raises(WorkerRequestFailed, match="engine report is malformed"):
            AgentEngine.from_report(broken, url="http://gpu-1:9000")


def test_an_agents_reported_capabilities_are_what_the_compatibility_check_reads() -> None:
    from revgate.manifests.revision import RuntimeEnvironment
    from revgate.registry.compat import CPU_ENGINE, GPU_ENGINE
    from revgate.serving.worker.client import AgentEngine, WorkerRequestFailed
    from revgate.serving.worker.report import engine_report

    runtime = RuntimeEnvironment(engine_distribution="vllm", engine_version="0.11.0", torch_version="2.8.0",
                                 device="cpu", lock_digest="sha256:" + "a" * 64)
    for built in (CPU_ENGINE, GPU_ENGINE):
        report = json.loads(json.dumps(engine_report(runtime, built, device="cpu", slots=2, memory_bytes=1 << 30)))
        assert AgentEngine.from_report(report, url="http://gpu-1:9000").can_run() == built
    broken = AgentEngine("http://gpu-1:9000", runtime, "cpu", {"dtypes": ["auto"]})
    with pytest.raises(WorkerRequestFailed, match="capabilities are malformed"):
        broken.can_run()


def test_agents_on_different_engine_builds_are_named_and_refused_by_rollouts_and_restores_alike() -> None:
    from revgate.manifests.revision import RuntimeEnvironment
    from revgate.serving.worker.client import AgentEngine, MixedEngineBuilds, one_build

    def engine(url: str, lock: str) -> AgentEngine:
        runtime = RuntimeEnvironment(engine_distribution="vllm", engine_version="0.11.0", torch_version="2.8.0",
                                     device="cpu", lock_digest="sha256:" + lock * 64)
        return AgentEngine(url, runtime, "cpu", {})

    same = [engine("http://gpu-1:9000", "a"), engine("http://gpu-2:9000", "a")]
    assert one_build(same) is same[0]
    with pytest.raises(MixedEngineBuilds) as mixed:
        one_build([same[0], engine("http://gpu-2:9000", "b")])
    assert "http://gpu-1:9000" in str(mixed.value) and "http://gpu-2:9000" in str(mixed.value)
