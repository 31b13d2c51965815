"""Warm-up: run the profile's request shapes against a fresh replica and measure its capacity.

Prompts are token-id lists of the exact profile lengths (``/v1/completions`` accepts them), so a
shape means the same number of tokens whatever the tokenizer. ``ignore_eos`` makes every request
produce exactly ``max_tokens``, so the measured throughput is for the stated shape.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from revgate.manifests.errors import RevgateError
from revgate.manifests.worker import WarmProfile
from revgate.serving.worker.state import Capacity


class WarmupFailed(RevgateError):
    """A warm-up request failed or produced no tokens; readiness was not published."""


@dataclass(frozen=True, slots=True)
class WarmResult:
    """One warm-up request: HTTP status, output tokens, and an error text when it failed."""

    status: int
    output_tokens: int
    error: str = ""


def vocab_size(model_dir: Path) -> int:
    """The model's vocabulary size from its ``config.json`` (fallback: 256, the byte range)."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        return int(config.get("vocab_size", 256))
    except (OSError, ValueError, TypeError):
        return 256


def warm_prompt(length: int, vocab: int, seed: int = 0) -> list[int]:
    """A prompt of exactly ``length`` token ids from the second quarter of the vocabulary.

    The first ids are often special tokens and the last ones often added tokens (Llama 3 puts its
    specials at the end); ordinary tokens sit in between.
    """
    low = max(vocab // 4, 1)
    span = max(vocab // 4, 1)
    return [low + (seed + index * 7) % span for index in range(length)]


def completion_payload(served_model: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """The ``/v1/completions`` body of one warm-up request (greedy, exactly ``max_tokens`` out)."""
    return {
        "model": served_model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


async def post_json(port: int, path: str, payload: dict[str, Any], timeout_s: float) -> tuple[int, bytes]:
    """POST JSON to 127.0.0.1:port over one connection; returns status and decoded body."""
    body = json.dumps(payload).encode("utf-8")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s)
    try:
        writer.write(head + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(-1), timeout_s)
    finally:
        writer.close()
    return parse_response(raw)


def parse_response(raw: bytes) -> tuple[int, bytes]:
    """Status and body of a complete HTTP/1.1 response read to EOF (chunked bodies decoded)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    chunked = any(line.lower().replace(" ", "") == "transfer-encoding:chunked" for line in lines[1:])
    return status, dechunk(body) if chunked else body


def dechunk(body: bytes) -> bytes:
    """Decode a chunked transfer-encoded body."""
    out, rest = bytearray(), body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2 :]
    return bytes(out)


def result_of(status: int, body: bytes) -> WarmResult:
    """Interpret one completion response: OK only with status 200 and at least one output token."""
    try:
        data = json.loads(body)
    except ValueError:
        return WarmResult(status, 0, f"response is not JSON: {body[:200]!r}")
    if status != 200:
        return WarmResult(status, 0, str(data.get("error", data))[:300] if isinstance(data, dict) else str(data))
    tokens = int(data.get("usage", {}).get("completion_tokens", 0))
    return WarmResult(status, tokens, "" if tokens > 0 else "no output tokens")


async def _one(port: int, payload: dict[str, Any], timeout_s: float, gate: asyncio.Semaphore) -> WarmResult:
    async with gate:
        try:
            return result_of(*await post_json(port, "/v1/completions", payload, timeout_s))
        except (OSError, TimeoutError, ValueError, IndexError) as error:
            return WarmResult(0, 0, f"{type(error).__name__}: {error}")


def check_results(results: list[WarmResult], replica_id: str) -> None:
    """Raise :class:`WarmupFailed` naming the first failure, if any request failed."""
    failures = [result for result in results if result.error]
    if failures:
        first = failures[0]
        raise WarmupFailed(
            f"{len(failures)} of {len(results)} warm-up requests failed; first: status {first.status}, {first.error}",
            where=f"replica {replica_id}",
            fix="Read the replica's engine log; check the warm profile against the execution config.",
        )


def capacity_of(results: list[WarmResult], elapsed_s: float, concurrency: int) -> Capacity:
    """Sustained requests/s and output tokens/s over the warm-up at its concurrency."""
    elapsed = max(elapsed_s, 1e-9)
    tokens = sum(result.output_tokens for result in results)
    return Capacity(len(results) / elapsed, tokens / elapsed, concurrency)


async def warm_up(
    port: int, served_model: str, profile: WarmProfile, vocab: int, replica_id: str = ""
) -> Capacity:
    """Run every warm-up request (``profile.concurrency`` at a time); the capacity, or WarmupFailed."""
    gate = asyncio.Semaphore(profile.concurrency)
    timeout_s = profile.timeout_ms / 1000
    payloads = [
        completion_payload(served_model, warm_prompt(length, vocab, seed), profile.max_tokens)
        for seed, length in enumerate(profile.request_lengths())
    ]
    started = time.monotonic()
    results = await asyncio.gather(*(_one(port, payload, timeout_s, gate) for payload in payloads))
    elapsed = time.monotonic() - started
    check_results(list(results), replica_id)
    return capacity_of(list(results), elapsed, profile.concurrency)
