"""The parts a rollout fault test runs against: a worker agent with vLLM on the CPU, signed revisions,
a router per route, the promotion flow as its own process, and open-loop traffic through the router.

One worker and one stable replica serve every test of a module; a test that leaves no stable
replica ready (a promotion drains the old one) gets a new one from :meth:`Estate.stable`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from revgate.flows import processes
from revgate.flows.demo import EXECUTION, demo_policy, publish, signing_key
from revgate.flows.site import ROUTE_ONLY, RouteSite
from revgate.flows.spec import PromotionSpec
from revgate.flows.steps import start_replica
from revgate.manifests.revision import InterfacePolicy, ServiceRevision
from revgate.manifests.rollout import RolloutPlan
from revgate.manifests.route import RevisionTarget, RouteSnapshot, RouteStore
from revgate.manifests.worker import WarmProfile
from revgate.registry.route_store import open_route_store
from revgate.registry.runtime import engine_runtime
from revgate.registry.store import open_store
from revgate.serving.worker.client import WorkerClient
from revgate.serving.worker.engine import free_port
from revgate.serving.worker.request import ReplicaRequest, SignaturePolicySpec
from revgate.zoo.index import load_revisions

WARM = WarmProfile(prompt_lengths=(8, 16), max_tokens=8, concurrency=4, request_count=8)


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.25) -> Any:
    """Poll ``condition`` until it returns something true; its value, or AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(every_s)


def write_site(path: Path, specs: Sequence[PromotionSpec]) -> Path:
    """The site configuration for these specs' routes, as a deployment run reads it: each route's parts
    as its spec has them, its gate policy and plan by name (``ROUTE-policy``, ``ROUTE-plan``), and its
    candidate by its name."""
    routes, policies, plans = {}, {}, {}
    for spec in specs:
        settings = spec.model_dump(mode="json", include=set(RouteSite.model_fields) - ROUTE_ONLY)
        routes[spec.route] = {**settings, "policy": f"{spec.route}-policy", "plan": f"{spec.route}-plan",
                              "candidates": {spec.candidate_name: spec.candidate_manifest}}
        policies[f"{spec.route}-policy"] = spec.gate_policy.model_dump(mode="json")
        plans[f"{spec.route}-plan"] = spec.plan.model_dump(mode="json")
    path.write_text(json.dumps({"routes": routes, "policies": policies, "plans": plans}, indent=1), encoding="utf-8")
    return path


@dataclass
class Sent:
    """One request of the open-loop traffic and what came back."""

    sent_s: float
    status: int = 0
    revision: str = ""
    generation: int = 0
    error: str = ""
    answered: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)


@dataclass
class OpenLoop:
    """Requests at a fixed rate through the router, whatever the answers take (open loop)."""

    url: str
    rate: float = 3.0
    sent: list[Sent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _one(self, item: Sent, number: int) -> None:
        body = json.dumps({"model": "default", "prompt": "add 1+2=", "max_tokens": 4}).encode()
        request = urllib.request.Request(f"{self.url}/v1/completions", data=body, method="POST",  # noqa: S310
                                         headers={"Content-Type": "application/json",
                                                  "x-session-id": f"s{number}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
                response.read()
                item.status = response.status
                item.revision = response.headers.get("x-revgate-revision", "")
                item.generation = int(response.headers.get("x-revgate-generation", "0"))
        except urllib.error.HTTPError as error:
            item.status, item.error = error.code, error.read()[:200].decode(errors="replace")
        except OSError as error:
            item.error = str(error)
        finally:
            item.answered.set()

    def _run(self) -> None:
        with ThreadPoolExecutor(max_workers=64) as pool:
            start, number = time.monotonic(), 0
            while not self._stop.is_set():
                item = Sent(time.time())
                self.sent.append(item)
                pool.submit(self._one, item, number)
                number += 1
                self._stop.wait(max(0.0, start + number / self.rate - time.monotonic()))

    @contextmanager
    def running(self) -> Iterator[OpenLoop]:
        """Send for the duration of the block; every request has its answer when the block ends."""
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(120)

    def failed(self, within_s: float = 90.0) -> list[Sent]:
        """Requests sent so far that got no 200.

        Traffic may still be running: each request sent so far is waited for (up to ``within_s`` in
        all) so that one still in flight is judged by its answer, not counted as a failure; one with
        no answer by then is a failure.
        """
        sent, deadline = list(self.sent), time.monotonic() + within_s
        for item in sent:
            if not item.answered.wait(max(0.0, deadline - time.monotonic())):
                item.error = item.error or f"no answer within {within_s:.0f} s"
        return [item for item in sent if item.status != 200]

    def served_by(self, fingerprint: str, after_s: float = 0.0) -> list[Sent]:
        """Answered requests sent after ``after_s`` that ``fingerprint`` served."""
        return [item for item in self.sent if item.revision == fingerprint and item.sent_s >= after_s]

    def off_route(self, history: list[RouteSnapshot]) -> list[Sent]:
        """Answers from a revision the route's generation (as the router reported it) did not route."""
        allowed = {s.generation: {t.fingerprint for t in (s.stable, s.candidate) if t is not None} for s in history}
        return [item for item in self.sent if item.status == 200 and item.revision not in allowed.get(
            item.generation, set())]


@dataclass
class Estate:
    """A worker agent, the signed revisions it may run, and the Prefect server the flow reports to."""

    root: Path
    store: str
    policy: SignaturePolicySpec
    digests: dict[str, str]
    token: Path
    worker_url: str
    prefect_api: str

    @property
    def client(self) -> WorkerClient:
        """The worker's control API."""
        return WorkerClient(self.worker_url, self.token.read_text().strip())

    def revision(self, name: str) -> ServiceRevision:
        """The service revision for a published zoo revision."""
        return ServiceRevision(name=name, artifact=open_store(self.store).get_manifest(self.digests[name]),
                               runtime=engine_runtime(Path(".venv-engine")), execution=EXECUTION,
                               interface=InterfacePolicy())

    def stable(self) -> RevisionTarget:
        """The ready stable replica (started when the worker has none)."""
        revision = self.revision("stable")
        ready = [r for r in self.client.replicas() if r.revision == revision.fingerprint and r.state == "ready"]
        view = ready[0] if ready else start_replica(
            self.client, ReplicaRequest(revision=revision, store=self.store, signature_policy=self.policy, warm=WARM))
        return RevisionTarget(fingerprint=revision.fingerprint, endpoints=(str(view.endpoint),),
                              served_model=str(view.served_model))

    def states(self, fingerprint: str) -> list[str]:
        """The states of every replica of ``fingerprint`` the worker has had."""
        return [str(r.state) for r in self.client.replicas() if r.revision == fingerprint]


@contextmanager
def estate(zoo_dir: Path, prefect_api: str, root: Path,
           names: tuple[str, ...] = ("stable", "improved")) -> Iterator[Estate]:
    """Publish the zoo's revisions ``names`` signed, and run a worker agent for the block."""
    key, public = signing_key(root / "keys")
    store = str(root / "artifacts")
    revisions = load_revisions(zoo_dir)
    digests = {name: publish(zoo_dir / revisions[name].path, store, key, root / "signatures")
               for name in names}
    token = processes.token_file(root / "token")
    with processes.worker_agent(root / "worker", token) as worker_url:
        yield Estate(root, store, SignaturePolicySpec(kind="key", public_key=str(public)), digests, token,
                     worker_url, prefect_api)


@dataclass
class Rollout:
    """One route with its own router, and the promotion flow for it running as its own process."""

    estate: Estate
    route: str
    folder: Path
    spec: PromotionSpec
    router_url: str
    admin_url: str
    traffic: OpenLoop
    more_traffic: list[OpenLoop] = field(default_factory=list)  # through the route's other routers, if any
    process: subprocess.Popen[str] | None = None

    @property
    def store(self) -> RouteStore:
        """The route store."""
        return open_route_store(self.spec.route_store)

    def current(self) -> RouteSnapshot:
        """The committed route."""
        snapshot = self.store.read(self.route)
        assert snapshot is not None
        return snapshot

    def history(self) -> list[RouteSnapshot]:
        """Every committed generation."""
        return list(self.store.history(self.route))

    def start_flow(self) -> None:
        """``revgate promote`` for the spec, as an operator runs it."""
        spec_file = self.folder / "promotion.json"
        spec_file.write_text(self.spec.model_dump_json(indent=2), encoding="utf-8")
        env = {**os.environ, "PREFECT_API_URL": self.estate.prefect_api, "PREFECT_LOGGING_LEVEL": "INFO"}
        log = (self.folder / "flow.log").open("w")
        # From the rollout's own folder: a controller has no engine environment; it pins the agents' engine.
        self.process = subprocess.Popen([sys.executable, "-m", "revgate.cli.main", "promote", str(spec_file)], env=env,
                                        stdout=log, stderr=subprocess.STDOUT, text=True, cwd=self.folder)

    def flow_log(self) -> str:
        """What the flow printed so far."""
        return (self.folder / "flow.log").read_text(errors="replace")

    def wait_flow(self, timeout_s: float) -> int:
        """The flow's exit code once it ends."""
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the flow did not end within {timeout_s:.0f} s:\n{self.flow_log()[-3000:]}") from None

    def rollback(self, by: str = "oncall") -> subprocess.CompletedProcess[str]:
        """An operator's ``revgate rollback`` that tells this route's router."""
        return subprocess.run(
            [sys.executable, "-m", "revgate.cli.main",
             "rollback", "--routes", self.spec.route_store, "--route", self.route,
             "--created-by", by, "--notify", self.admin_url, "--admin-token-file", str(self.estate.token)],
            capture_output=True, text=True, check=False, timeout=120,
        )


@contextmanager
def rollout(estate: Estate, folder: Path, route: str, plan: RolloutPlan, *, approval: str = "auto",
            rate: float = 1.5, routers: int = 1) -> Iterator[Rollout]:
    """A route on the estate's stable replica, its routers (one record sink for all), open-loop traffic at
    ``rate`` through each for the whole block, and a spec naming every router."""
    folder.mkdir(parents=True, exist_ok=True)
    routes = str(folder / "routes")
    stable = estate.stable()
    open_route_store(routes).write(RouteSnapshot(route=route, generation=1, stable=stable, created_by="seed",
                                                 created_at=datetime.now(UTC), reveal_revision=True))
    trace = folder / "trace.jsonl"
    trace.write_text("", encoding="utf-8")
    sink = str(folder / "records")  # every router's records, as the flow reads them
    with ExitStack() as stack:
        edges = [stack.enter_context(processes.router(routes, route, folder / ("router" if n == 0 else f"router-{n}"),
                                                      estate.token, sink=sink, router_id=f"edge-{n + 1}"))
                 for n in range(routers)]
        (public_url, admin_url), more = edges[0], edges[1:]
        spec = PromotionSpec(
            route=route, candidate_manifest=estate.digests["improved"], candidate_name="improved",
            artifact_store=estate.store, route_store=routes, signature=estate.policy, execution=EXECUTION,
            warm=WARM, gate_policy=demo_policy(), plan=plan, worker_url=estate.worker_url,
            worker_token_file=str(estate.token), router_url=public_url, router_admin_url=admin_url,
            more_routers=tuple(admin for _, admin in more), router_admin_token_file=str(estate.token),
            records_sink=sink, trace=str(trace),
            tracking_uri=f"sqlite:///{(folder / 'mlflow.db').resolve()}", evidence_root=str(folder / "evidence"),
            approval=approval, approval_timeout_s=600,  # type: ignore[arg-type]
        )
        traffic = OpenLoop(public_url, rate=rate)
        stack.enter_context(traffic.running())
        handle = Rollout(estate, route, folder, spec, public_url, admin_url, traffic,
                         more_traffic=[stack.enter_context(OpenLoop(url, rate=rate).running()) for url, _ in more])
        try:
            yield handle
        finally:
            if handle.process is not None and handle.process.poll() is None:
                handle.process.kill()
                handle.process.wait(30)


@dataclass
class LedgerServer:
    """An MLflow tracking server over one SQLite store, on one port, that a test stops and starts again."""

    folder: Path
    port: int = field(default_factory=free_port)
    running: ExitStack | None = None

    @property
    def url(self) -> str:
        """The tracking URI clients use, the same across restarts."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server (again) over the same store; returns once it answers."""
        assert self.running is None
        argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                f"sqlite:///{(self.folder / 'mlflow.db').resolve()}", "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", "1",
                "--artifacts-destination", str((self.folder / "ledger-artifacts").resolve())]
        stack = ExitStack()
        stack.enter_context(processes.service(argv, f"{self.url}/health", self.folder / "mlflow-server.log",
                                              env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, timeout_s=180))
        self.running = stack

    def stop(self) -> None:
        """Stop the server: clients get refused connections until :meth:`start`."""
        if self.running is not None:
            self.running.close()
            self.running = None
