"""One end-to-end run through a real vLLM replica: the official client, through the router, to the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from revgate.evaluation.records import RequestRecord
from revgate.manifests.route import RouteSnapshot
from tests.integration.router_harness import RouterProcess, fingerprint, router_process, wait_until

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine_router(vllm_stable: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    first = RouteSnapshot.build(
        route="chat", generation=1, created_by="tests", created_at="2026-11-29T10:00:00Z", reveal_revision=True,
        # Callers ask for the route; the replica serves the model as "stable": the router rewrites it.
        stable={"fingerprint": fingerprint("stable"), "endpoints": [vllm_stable.url], "served_model": "stable"},
    )
    with router_process(Path(tmp_path_factory.mktemp("engine-router")), "chat", first) as process:
        yield process


def test_openai_client_through_the_router_to_vllm(engine_router: RouterProcess) -> None:
    client = openai.OpenAI(base_url=f"{engine_router.url}/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(model="chat", prompt="add 2+3=", max_tokens=4, temperature=0)
    assert completion.model == "stable" and completion.usage and completion.usage.completion_tokens >= 1
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "add 2+3="}], max_tokens=4, temperature=0)
    assert raw.headers["x-revgate-revision"] == fingerprint("stable")
    assert raw.headers["x-revgate-generation"] == "1"
    # The usage chunk gives the record its token count even when the tiny model's deltas are empty text
    # (a stream without usage is counted by its non-empty deltas, which a model may not produce).
    stream = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "add 2+3="}],
                                            max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    finished = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert finished and finished[-1] in ("stop", "length")
    assert next(model.id for model in client.models.list()) == "stable"
    served: list[RequestRecord] = []

    def written() -> bool:  # records are flushed in batches: poll, not a fixed wait
        records = [RequestRecord.from_json(line) for line in engine_router.records_lines()]
        served[:] = [record for record in records if record.outcome == "ok" and record.output_tokens]
        return len(served) >= 3

    wait_until(written, timeout=30, describe=lambda: f"records written: {engine_router.records_lines()}")
    assert all(record.revision == fingerprint("stable") for record in served)
    assert all(record.ttft_s is not None and record.ttft_s > 0 for record in served)


def answer_of(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, str]:
    """POST a completion; the status and the arm the router says served it."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(), method="POST",  # noqa: S310
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            response.read()
            return int(response.status), str(response.headers.get("x-revgate-arm", ""))
    except urllib.error.HTTPError as error:
        return int(error.code), str(error.headers.get("x-revgate-arm", ""))


def test_a_tenant_on_the_canary_with_bad_requests_and_1_ms_deadlines_fails_no_gate_of_an_equal_revision(
    vllm_stable: Any, tmp_path: Path
) -> None:
    from revgate.evaluation.gates import Evidence, gates_from_policy, judge
    from revgate.manifests.gates import GatePolicy

    # The candidate is the same engine under another fingerprint and address: a revision equal to stable.
    same_engine = vllm_stable.url.replace("127.0.0.1", "localhost")
    first = RouteSnapshot.build(
        route="chat", generation=1, created_by="tests", created_at="2026-11-29T10:00:00Z", reveal_revision=True,
        stable={"fingerprint": fingerprint("stable"), "endpoints": [vllm_stable.url], "served_model": "stable"},
        candidate={"fingerprint": fingerprint("copy"), "endpoints": [same_engine], "served_model": "stable",
                   "weight_ppm": 500_000, "lease_expires_at": "2099-01-01T00:00:00Z"},
    )
    good = {"model": "chat", "prompt": "add 2+3=", "max_tokens": 4, "temperature": 0}
    with router_process(tmp_path, "chat", first) as router:
        # The reproduction: the answer tells a caller its arm, and the arm follows its session id.
        on_canary = [f"t{n}" for n in range(60) if answer_of(router.url, good, {"x-session-id": f"t{n}"})[1]
                     == "candidate"][:20]
        assert len(on_canary) >= 10, on_canary
        for session in on_canary:
            assert answer_of(router.url, {**good, "max_tokens": -1}, {"x-session-id": session})[0] == 400
            assert answer_of(router.url, good, {"x-session-id": session, "x-revgate-timeout-ms": "1"})[0] == 504
        for n in range(60):  # users, whichever arm their sessions land on
            assert answer_of(router.url, good, {"x-session-id": f"u{n}"})[0] == 200
        expected = 60 + 60 + 2 * len(on_canary)

        def all_written() -> bool:
            return len(router.records_lines()) >= expected

        wait_until(all_written, timeout=30, describe=lambda: f"{len(router.records_lines())} of {expected} records")
        records = [RequestRecord.from_json(line) for line in router.records_lines()]
    stable = tuple(r for r in records if r.arm == "stable")
    candidate = tuple(r for r in records if r.arm == "candidate")
    policy = GatePolicy.build(look_every=20, min_samples_per_slice=20, max_samples_per_stage=200,
                              slo=[{"e2e_ms": 10_000, "attainment": "0.9"}])
    gates = {g.gate: g for g in judge(gates_from_policy(policy), policy, Evidence(stable, candidate, final=True)).gates}
    print({name: (g.outcome, g.reason) for name, g in gates.items()})
    # Before: the tenant's 400s and 504s were the candidate's errors and SLO misses, and both gates failed it.
    assert gates["errors"].outcome != "fail" and gates["slo-*"].outcome != "fail", gates
    # They are the callers', compared between the arms: all on one arm, that gate names them.
    assert gates["caller-outcomes"].outcome == "fail", gates["caller-outcomes"]
    assert int(gates["slo-*"].numbers["not_counted_callers"]) == 2 * len(on_canary)
