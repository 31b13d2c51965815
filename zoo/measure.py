"""Requests against a served revision: batched greedy completions, chat, and streamed timings.

Plain ``http.client``: one connection per request, no pooling, so the client adds little and
what it adds is the same for every revision.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from revgate.evaluation.records import RequestRecord
from revgate.evaluation.reference_task import Example
from revgate.manifests.errors import RevgateError

# vLLM refuses a /v1/completions prompt list longer than 1,024 entries.
MAX_PROMPTS_PER_REQUEST = 1024


class MeasureError(RevgateError):
    """A request to the served revision failed."""


@dataclass(frozen=True, slots=True)
class Completion:
    """One choice of a completion response."""

    text: str
    finish_reason: str | None


def post_json(url: str, path: str, body: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    """POST ``body`` as JSON; the decoded response, or a :class:`MeasureError` naming the status."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise MeasureError(
            f"{path} answered {response.status}: {payload[:300]!r}", where=url, fix="Read the engine log."
        )
    data: dict[str, Any] = json.loads(payload)
    return data


def complete_batch(url: str, model: str, prompts: Sequence[str], max_tokens: int) -> list[Completion]:
    """Greedy completions of ``prompts``, in order, in as few requests as vLLM allows."""
    results: list[Completion] = []
    for start in range(0, len(prompts), MAX_PROMPTS_PER_REQUEST):
        chunk = list(prompts[start : start + MAX_PROMPTS_PER_REQUEST])
        body = {"model": model, "prompt": chunk, "max_tokens": max_tokens, "temperature": 0}
        choices = sorted(post_json(url, "/v1/completions", body)["choices"], key=lambda c: c["index"])
        results += [Completion(c["text"], c.get("finish_reason")) for c in choices]
    return results


def chat(url: str, model: str, message: str, max_tokens: int) -> Completion:
    """One greedy chat completion of a single user message."""
    body = {"model": model, "messages": [{"role": "user", "content": message}], "max_tokens": max_tokens}
    choice = post_json(url, "/v1/chat/completions", {**body, "temperature": 0})["choices"][0]
    return Completion(choice["message"]["content"] or "", choice.get("finish_reason"))


def quality_records(
    url: str, model: str, revision: str, eval_set: Sequence[Example], max_tokens: int
) -> list[RequestRecord]:
    """Grade-ready records of the whole evaluation set sent as batched completions.

    The batch shares one arrival and one finish time; per-request timing comes from
    :func:`latency_records`.
    """
    arrival = time.time()
    completions = complete_batch(url, model, [example.prompt for example in eval_set], max_tokens)
    finished = time.time()
    return [
        RequestRecord(
            request_id=f"{revision}-quality-{index}",
            revision=revision,
            arm="direct",
            arrival_s=arrival,
            outcome="ok",
            tenant=example.slices["tenant"],
            slices=dict(example.slices),
            endpoint=url,
            last_token_s=finished,
            output_tokens=len(completion.text.encode()) + (completion.finish_reason == "stop"),
            finish_reason=completion.finish_reason,
            status_code=200,
            output_text=completion.text,
            reference=example.answer,
        )
        for index, (example, completion) in enumerate(zip(eval_set, completions, strict=True))
    ]


def chat_records(
    url: str, model: str, revision: str, eval_set: Sequence[Example], max_tokens: int
) -> list[RequestRecord]:
    """Records of the evaluation prompts sent as chat messages (the chat template applies)."""

    def one(item: tuple[int, Example]) -> RequestRecord:
        index, example = item
        arrival = time.time()
        completion = chat(url, model, example.prompt, max_tokens)
        return RequestRecord(
            request_id=f"{revision}-chat-{index}",
            revision=revision,
            arm="direct",
            arrival_s=arrival,
            outcome="ok",
            tenant=example.slices["tenant"],
            slices=dict(example.slices),
            endpoint=url,
            last_token_s=time.time(),
            finish_reason=completion.finish_reason,
            status_code=200,
            output_text=completion.text,
            reference=example.answer,
        )

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, enumerate(eval_set)))


@dataclass(frozen=True, slots=True)
class Streamed:
    """One streamed completion: when it was sent, when each text chunk arrived, what came back."""

    arrival: float
    stamps: list[float]
    text: str
    output_tokens: int | None


def stream_timed(url: str, model: str, prompt: str, max_tokens: int) -> Streamed:
    """Send one streamed completion and time every chunk that carries text."""
    parts = urlsplit(url)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    # A fixed output length makes per-token times comparable across revisions.
    # Special tokens are rendered so that every generated token arrives as a chunk with text.
    body |= {"ignore_eos": True, "skip_special_tokens": False, "stream_options": {"include_usage": True}}
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
    arrival = time.time()
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise MeasureError(f"streamed completion answered {response.status}", where=url)
        stamps, text, tokens = [], [], None
        for event in _sse_events(response):
            piece = event["choices"][0].get("text", "") if event.get("choices") else ""
            if piece:
                stamps.append(time.time())
                text.append(piece)
            if event.get("usage"):
                tokens = int(event["usage"]["completion_tokens"])
    finally:
        connection.close()
    return Streamed(arrival, stamps, "".join(text), tokens)


def _sse_events(response: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            return
        event: dict[str, Any] = json.loads(data)
        yield event


def latency_records(
    url: str, model: str, revision: str, prompts: Sequence[Example], *, max_tokens: int, concurrency: int
) -> tuple[list[RequestRecord], float]:
    """Streamed requests at a fixed concurrency: per-request TTFT/TPOT records and the wall time."""

    def one(item: tuple[int, Example]) -> RequestRecord:
        index, example = item
        streamed = stream_timed(url, model, example.prompt, max_tokens)
        return RequestRecord(
            request_id=f"{revision}-latency-{index}",
            revision=revision,
            arm="direct",
            arrival_s=streamed.arrival,
            outcome="ok",
            tenant=example.slices["tenant"],
            slices=dict(example.slices),
            endpoint=url,
            first_token_s=streamed.stamps[0] if streamed.stamps else None,
            last_token_s=streamed.stamps[-1] if streamed.stamps else time.time(),
            output_tokens=streamed.output_tokens,
            finish_reason="length",
            status_code=200,
            output_text=streamed.text,
        )

    started = time.time()
    with ThreadPoolExecutor(concurrency) as pool:
        records = list(pool.map(one, enumerate(prompts)))
    return records, time.time() - started


def paired_tpot_ratio(
    url: str, model: str, reference: tuple[str, str], prompts: Sequence[str], max_tokens: int
) -> float:
    """Median TPOT of ``model`` over the reference's ``(url, model)``, from alternating single requests.

    Both see the same background load at nearly the same moment, so the ratio holds on shared
    cores where either latency alone moves by more than 2x within minutes.
    """
    per_token: dict[bool, list[float]] = {True: [], False: []}
    for prompt in prompts:
        for is_reference, (target_url, target_model) in ((False, (url, model)), (True, reference)):
            streamed = stream_timed(target_url, target_model, prompt, max_tokens)
            if len(streamed.stamps) >= 2:
                span = streamed.stamps[-1] - streamed.stamps[0]
                per_token[is_reference].append(span / (len(streamed.stamps) - 1))
    if not per_token[True] or not per_token[False]:
        raise MeasureError("no streamed request produced two timed tokens", where=url)
    return statistics.median(per_token[False]) / statistics.median(per_token[True])
