"""Reading usage and output text from OpenAI-shaped bodies; metrics text format."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from revgate.serving.router.metrics import RouterMetrics
from revgate.serving.router.parse import UNREADABLE, output_text, parse_body, rewrite_model, usage_of

BODY = (b'{"id":"x","choices":[{"index":0,"text":"hello","finish_reason":"stop"}],'
        b'"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}')
STREAM = (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{"content":"he"},"finish_reason":null}]}\n\n'
          b'data: {"choices":[{"index":0,"delta":{"content":"llo"},"finish_reason":"length"}]}\n\n'
          b"data: [DONE]\n\n")


def test_usage_from_a_response_and_a_stream() -> None:
    usage = usage_of(BODY, streamed=False)
    assert (usage.prompt_tokens, usage.output_tokens, usage.finish_reason) == (5, 2, "stop")
    streamed = usage_of(STREAM, streamed=True)
    assert (streamed.output_tokens, streamed.finish_reason) == (2, "length")


# What usage_of read before it searched from the end: the last match of each pattern over the whole body.
_REFERENCE = {name: re.compile(pattern) for name, pattern in (
    ("prompt", rb'"prompt_tokens"\s*:\s*(\d+)'), ("output", rb'"completion_tokens"\s*:\s*(\d+)'),
    ("finish", rb'"finish_reason"\s*:\s*"([a-z_]+)"'))}
_FRAGMENTS = st.sampled_from([
    b'"prompt_tokens":5', b'"prompt_tokens" : 12', b'"prompt_tokens":null', b'"completion_tokens":7',
    b'"completion_tokens":  3', b'"completion_tokens":null', b'"completion_tokens":"9"', b'"finish_reason":"stop"',
    b'"finish_reason":null', b'"finish_reason": "length"', b'"finish_reason":"STOP"', b'"text":"a \\"b\\""',
    b'"content":"x"', b"data: [DONE]", b",", b"{", b"}", b" ", b'"usage":{',
])


@given(st.lists(_FRAGMENTS, max_size=12))
def test_usage_searched_from_the_end_reads_what_the_last_match_of_a_full_scan_reads(parts: list[bytes]) -> None:
    body = b"".join(parts)
    last = {name: (found[-1] if (found := pattern.findall(body)) else None) for name, pattern in _REFERENCE.items()}
    usage = usage_of(body, streamed=False)
    assert usage.prompt_tokens == (None if last["prompt"] is None else int(last["prompt"]))
    assert usage.output_tokens == (None if last["output"] is None else int(last["output"]))
    assert usage.finish_reason == (None if last["finish"] is None else last["finish"].decode())


def test_output_text_joins_stream_deltas() -> None:
    assert output_text(BODY, streamed=False) == "hello"
    assert output_text(STREAM, streamed=True) == "hello"
    assert output_text(b"not json", streamed=False) is None


def test_model_rewrite_touches_only_the_top_level_model() -> None:
    body = b'{"model":"chat","messages":[{"role":"user","content":"{\\"model\\":\\"x\\"}"}]}'
    rewritten = rewrite_model(body, "rev-abc")
    assert rewritten.startswith(b'{"model":"rev-abc"')
    assert b'\\"model\\":\\"x\\"' in rewritten


def test_metrics_render_prometheus_text_with_bounded_labels() -> None:
    metrics = RouterMetrics()
    labels = (("route", "chat"), ("revision", "abc"))
    metrics.requests[(*labels, ("arm", "stable"), ("outcome", "ok"))] += 2
    metrics.ttft.observe(labels, 0.003)
    metrics.ttft.observe(labels, 0.2)
    text = metrics.render().decode()
    assert 'revgate_router_requests_total{route="chat",revision="abc",arm="stable",outcome="ok"} 2' in text
    assert 'revgate_router_ttft_seconds_bucket{route="chat",revision="abc",le="0.005"} 1' in text
    assert 'revgate_router_ttft_seconds_bucket{route="chat",revision="abc",le="+Inf"} 2' in text
    assert 'revgate_router_ttft_seconds_count{route="chat",revision="abc"} 2' in text


def test_fast_record_lines_equal_the_schema_serialisation() -> None:
    from revgate.evaluation.records import RequestRecord
    from revgate.serving.router.records import dataclass_line

    record = RequestRecord(request_id="r1", revision="sha256:" + "a" * 64, arm="candidate", arrival_s=1.5,
                           outcome="ok", slices={"lang": "en"}, first_token_s=1.6, output_tokens=3,
                           output_text="héllo")
    assert dataclass_line(record) == record.to_json()
    assert RequestRecord.from_json(dataclass_line(record)) == record


def test_a_body_is_parsed_once_and_the_rewrite_keeps_what_json_allows() -> None:
    body = b'{"model":"chat","prompt":"caf\\u00e9","n":123456789012345678901234567890,"x":[1.5,null]}'
    document = parse_body(body)
    assert isinstance(document, dict) and document["n"] == 123456789012345678901234567890  # past orjson's 64 bits
    rewritten = json.loads(rewrite_model(body, "rev@abc", document))
    assert rewritten == {**json.loads(body), "model": "rev@abc"}
    assert parse_body(b"not json") is UNREADABLE and rewrite_model(b"not json", "rev@abc", UNREADABLE) == b"not json"
    assert parse_body(b"[" * 100_000) is UNREADABLE  # nesting past any parser's depth: unreadable, not a crash
    lone = b'{"model":"chat","prompt":"\\ud800"}'  # valid JSON, not encodable as UTF-8 once decoded
    assert json.loads(rewrite_model(lone, "rev@abc", parse_body(lone)))["prompt"] == "\ud800"
