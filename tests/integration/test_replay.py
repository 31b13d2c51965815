"""Open-loop replay against real HTTP servers that stream SSE token by token."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from revgate.cli.main import main
from revgate.evaluation import evidence, metrics
from revgate.evaluation.replay import replay
from revgate.evaluation.traces import TraceEntry, write_trace
from tests.integration.router_harness import UpstreamFarm

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def farm() -> Iterator[UpstreamFarm]:
    with UpstreamFarm(["replay-a"]) as running:
        yield running


def entries(n: int, rate: float, delay_ms: int, tokens: int = 4) -> list[TraceEntry]:
    return [
        TraceEntry(
            request_id=f"r{i}",
            offset_s=i / rate,
            slices={"family": "add"},
            tenant="t",
            reference="x",
            body={"prompt": "add 1+1=", "max_tokens": tokens, "user": f"delay-ms:{delay_ms}"},
        )
        for i in range(n)
    ]


def test_requests_leave_on_schedule_while_earlier_ones_are_still_streaming(farm: UpstreamFarm) -> None:
    # 40 requests over 0.4 s, each streaming 4 tokens 60 ms apart. Bounds are relative to requests of the
    # same shape sent alone, one after another, in this test: on a busy machine both slow down together.
    target = farm["replay-a"].url + "/v1"
    alone = asyncio.run(replay(entries(3, 2.0, 60), target, "replay-a"))
    request_s = max(metrics.latencies_ms(alone.records, "e2e")) / 1000
    alone_tpot = float(np.median(metrics.latencies_ms(alone.records, "tpot")))
    result = asyncio.run(replay(entries(40, 100.0, 60), target, "replay-a"))
    assert len(result.records) == 40 and {r.outcome for r in result.records} == {"ok"}
    assert result.wall_s < 0.4 + 3 * request_s  # a closed loop would need 40 request times
    assert max(result.lateness_s) < request_s  # no request waited for an earlier one to finish
    ttft = metrics.latencies_ms(result.records, "ttft")
    tpot = metrics.latencies_ms(result.records, "tpot")
    assert ttft.min() >= 55  # the server's first-token delay: a physical lower bound, not a speed goal
    assert 55 <= float(np.median(tpot)) < 2.5 * alone_tpot  # streams overlap without slowing each other down
    first = next(r for r in result.records if r.request_id == "r0")
    assert first.output_tokens == 4 and first.output_text == "replay-a-0 replay-a-1 replay-a-2 replay-a-3 "
    assert first.finish_reason == "length" and first.reference == "x" and first.slices == {"family": "add"}


def test_a_paced_replay_never_has_more_than_its_slots_in_flight(farm: UpstreamFarm) -> None:
    # The flow's probes: all due at once, but at most three out at a time, each timed from when it left.
    result = asyncio.run(replay(entries(12, 1000.0, 40), farm["replay-a"].url + "/v1", "replay-a", max_in_flight=3))
    assert len(result.records) == 12 and {r.outcome for r in result.records} == {"ok"}
    spans = [(r.arrival_s, r.last_token_s) for r in result.records]
    assert all(end is not None for _, end in spans)
    most = max(sum(start <= moment < end for start, end in spans if end is not None) for moment, _ in spans)
    assert most == 3  # the slots were used, and never exceeded
    assert min(metrics.latencies_ms(result.records, "ttft")) >= 35  # timed from leaving, not from the due time
    assert max(metrics.latencies_ms(result.records, "e2e")) < 4 * min(metrics.latencies_ms(result.records, "e2e"))


def test_rejections_and_timeouts_are_recorded_not_dropped(farm: UpstreamFarm) -> None:
    farm["replay-a"].fail_next = 3
    slow = [TraceEntry(request_id="slow", offset_s=0.3, body={"prompt": "x", "max_tokens": 4, "user": "delay-ms:800"})]
    result = asyncio.run(replay([*entries(5, 50.0, 0), *slow], farm["replay-a"].url + "/v1", "replay-a", timeout_s=0.5))
    outcomes = sorted(r.outcome for r in result.records)
    assert outcomes == ["ok", "ok", "rejected", "rejected", "rejected", "timeout"]
    assert metrics.outcome_rates(result.records)["rejected_rate"] == pytest.approx(0.5)


def test_replay_command_writes_records_and_prints_a_summary(
    farm: UpstreamFarm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, out = tmp_path / "trace.jsonl", tmp_path / "records.jsonl"
    write_trace(entries(20, 200.0, 5), trace)
    code = main(["replay", str(trace), "--target", farm["replay-a"].url + "/v1", "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0 and "generator lateness" in printed and "ttft_p99_ms" in printed
    records = evidence.read_records(out)
    assert len(records) == 20 and records[0].revision == "replay-a"  # model name asked of the server
