"""Test harness for the router: small OpenAI-shaped upstream servers and a router subprocess.

The upstreams are real HTTP servers (starlette on uvicorn, in a thread) that stream SSE token by
token, name themselves in every answer and remember what they were asked, so a test can tell
which revision served a request and which requests a shadow saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from revgate.manifests.route import RouteSnapshot
from revgate.registry.route_store import FileRouteStore
from revgate.serving.worker.engine import free_port
from tests.conftest import ROOT, wait_for_port


def fingerprint(name: str) -> str:
    """A stable fake revision fingerprint for a test revision name."""
    import hashlib

    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


@dataclass
class Upstream:
    """One fake replica of a revision."""

    name: str
    port: int = 0
    seen: list[dict[str, Any]] = field(default_factory=list)
    fail_next: int = 0  # answer this many requests with 503 first
    cancelled: int = 0  # streams whose caller went away mid-stream
    linger_after_done_s: float = 0.0  # hold the body open after [DONE], as a busy engine may before its last chunk

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/completions", self._complete, methods=["POST"]),
            Route("/v1/chat/completions", self._complete, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model", "created": 0,
                                                          "owned_by": "test"}]})

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append({"path": request.url.path, "body": body, "headers": dict(request.headers)})
        if self.fail_next > 0:
            self.fail_next -= 1
            return JSONResponse({"error": {"message": "draining"}}, status_code=503)
        chat = request.url.path.endswith("chat/completions")
        tokens = int(body.get("max_tokens") or 4)
        # The test asks for slow tokens in the OpenAI "user" field, which every proxy passes through.
        user = str(body.get("user") or "")
        delay = int(user.removeprefix("delay-ms:")) / 1000 if user.startswith("delay-ms:") else 0.0
        if body.get("stream"):
            return StreamingResponse(self._stream(chat, tokens, delay), media_type="text/event-stream")
        await asyncio.sleep(delay * tokens)
        text = "".join(f"{self.name}-{index} " for index in range(tokens))
        return JSONResponse(_completion(self.name, chat, text, tokens))

    async def _stream(self, chat: bool, tokens: int, delay: float) -> AsyncIterator[bytes]:
        try:
            for index in range(tokens):
                await asyncio.sleep(delay)
                piece = f"{self.name}-{index} "
                finish = "length" if index == tokens - 1 else None
                yield b"data: " + json.dumps(_chunk(self.name, chat, piece, finish)).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            await asyncio.sleep(self.linger_after_done_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def _completion(model: str, chat: bool, text: str, tokens: int) -> dict[str, Any]:
    usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": "length", "logprobs": None}
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
                "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": model, "choices": [choice],
            "usage": usage}


def _chunk(model: str, chat: bool, piece: str, finish: str | None) -> dict[str, Any]:
    if chat:
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": finish, "logprobs": None}]}
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": model,
            "choices": [{"index": 0, "text": piece, "finish_reason": finish, "logprobs": None}]}


class UpstreamFarm:
    """Several fake upstreams served from one background thread."""

    def __init__(self, names: list[str]) -> None:
        self.upstreams = {name: Upstream(name, free_port()) for name in names}
        self.servers = [
            uvicorn.Server(uvicorn.Config(upstream.app(), host="127.0.0.1", port=upstream.port, log_level="warning",
                                          lifespan="off", timeout_graceful_shutdown=1))
            for upstream in self.upstreams.values()
        ]
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        await asyncio.gather(*(server.serve() for server in self.servers))

    def __enter__(self) -> UpstreamFarm:
        self.thread.start()
        for upstream in self.upstreams.values():
            wait_for_port(upstream.port, 20)
        return self

    def __exit__(self, *_: object) -> None:
        for server in self.servers:
            server.should_exit = True
        self.thread.join(10)

    def __getitem__(self, name: str) -> Upstream:
        return self.upstreams[name]


def snapshot(route: str, generation: int, stable: list[Upstream], *, candidate: list[Upstream] | None = None,
             weight_ppm: int = 0, lease_s: int = 3600, shadow: list[Upstream] | None = None, sample_ppm: int = 0,
             side_effecting_tools: tuple[str, ...] = ("*",), reveal_revision: bool = True,
             **more: Any) -> RouteSnapshot:
    """A snapshot whose revisions are named after their upstreams' names (``more``: other snapshot fields).

    Answers name their revision and arm here (``reveal_revision``): these tests check who served what.
    """
    now = datetime.now(UTC)
    lease = (now + timedelta(seconds=lease_s)).isoformat()
    fields: dict[str, Any] = {
        "route": route, "generation": generation, "created_by": "tests", "created_at": now.isoformat(),
        "reveal_revision": reveal_revision, **more,
        "stable": {"fingerprint": fingerprint(stable[0].name.rstrip("0123456789")),
                   "endpoints": [item.url for item in stable]},
    }
    if candidate:
        fields["candidate"] = {"fingerprint": fingerprint(candidate[0].name.rstrip("0123456789")),
                               "endpoints": [item.url for item in candidate], "weight_ppm": weight_ppm,
                               "lease_expires_at": lease}
    if shadow:
        fields["shadow"] = {"fingerprint": fingerprint(shadow[0].name.rstrip("0123456789")),
                            "endpoints": [item.url for item in shadow], "sample_ppm": sample_ppm,
                            "lease_expires_at": lease, "side_effecting_tools": list(side_effecting_tools)}
    return RouteSnapshot.build(**fields)


@dataclass
class RouterProcess:
    """A router started through the command line, with its store, token and record files."""

    store: FileRouteStore
    route: str
    port: int
    admin_port: int
    token: str
    records: Path
    paired: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def commit(self, make: Any, **kwargs: Any) -> RouteSnapshot:
        """Write the next generation built by ``make(generation)`` and notify the router."""
        current = self.store.read(self.route)
        new = make((current.generation if current else 0) + 1, **kwargs)
        self.store.write(new)
        self.notify()
        return new  # type: ignore[no-any-return]

    def notify(self) -> dict[str, Any]:
        response = httpx.post(f"{self.admin_url}/admin/notify", headers={"Authorization": f"Bearer {self.token}"})
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    def records_lines(self) -> list[str]:
        return self.records.read_text().splitlines() if self.records.exists() else []


@contextlib.contextmanager
def router_process(
    folder: Path, route: str, first: RouteSnapshot, *, poll_interval: float = 0.2, extra: tuple[str, ...] = (),
    program: tuple[str, ...] = (),
) -> Iterator[RouterProcess]:
    """Start ``revgate router`` on free ports over a file store holding ``first`` (``extra``: more flags;
    ``program``: an installed ``revgate`` command to run instead of this checkout's, from ``folder``)."""
    store = FileRouteStore(folder / "routes")
    store.write(first)
    token = secrets.token_hex(16)
    (folder / "token").write_text(token)
    (folder / "token").chmod(0o600)  # the router refuses a token file others can read
    port, admin_port = free_port(), free_port()
    records, paired = folder / "records.jsonl", folder / "paired.jsonl"
    command = [*(program or (sys.executable, "-m", "revgate.cli.main")), "router", "--routes", str(folder / "routes"),
               "--route", route,
               "--host", "127.0.0.1", "--port", str(port), "--admin-port", str(admin_port),
               "--admin-token-file", str(folder / "token"), "--records", str(records),
               "--paired-records", str(paired), "--poll-interval", str(poll_interval), *extra]
    log = (folder / "router.log").open("wb")
    process = subprocess.Popen(command, cwd=folder if program else ROOT, stdout=log, stderr=subprocess.STDOUT,
                               env=dict(os.environ))
    try:
        wait_for_port(port, 30, process)
        wait_for_port(admin_port, 30, process)
        yield RouterProcess(store, route, port, admin_port, token, records, paired, process)
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def wait_until(predicate: Any, timeout: float = 5.0, describe: Any = None) -> None:
    """Poll ``predicate`` until it is true or fail, saying what was seen (``describe()``) if given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time" + (f"; {describe()}" if describe else ""))
