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
        route="chat", generation=1, created_by="tests", created_at="2026-11-29T10:00:00Z",
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
