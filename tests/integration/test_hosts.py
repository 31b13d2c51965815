"""Parts on hosts of their own: the hosts fixture itself, then the data plane across hosts.

Each host is a network namespace (tests/integration/hosts.py). The first tests check what the later
ones rely on: a server on one host answers a client on another by its 198.18 address and on no
other; loopback is each host's own; a cut parts two hosts and no others; cleanup leaves no process
behind. The data-plane test runs moto's S3 server on ``store``, a worker agent with one vLLM replica
on ``gpu-1``, a router on ``edge-1`` and one on ``edge-2``, and users on ``control``; then ``edge-1``
loses ``store`` while serving.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from mlflow.tracking import MlflowClient

from revgate.evaluation.records import RequestRecord
from revgate.evaluation.traces import generate_trace, write_trace
from revgate.flows import processes
from revgate.flows.demo import EXECUTION, demo_plan, demo_policy, signing_key
from revgate.flows.spec import PromotionSpec
from revgate.flows.steps import start_replica
from revgate.manifests.revision import InterfacePolicy, ServiceRevision
from revgate.manifests.rollout import Bake, RolloutPlan, SetWeight
from revgate.manifests.route import RevisionTarget, RouteSnapshot, RouteStore
from revgate.registry.build import build_manifest
from revgate.registry.record_signing import load_public_key
from revgate.registry.record_store import RecordReader, open_record_store
from revgate.registry.route_store import open_route_store
from revgate.registry.runtime import engine_runtime
from revgate.registry.signing import sign_with_key
from revgate.registry.store import open_store
from revgate.serving.worker.client import WorkerClient
from revgate.serving.worker.request import ReplicaRequest, SignaturePolicySpec
from revgate.zoo.index import load_revisions
from tests.integration.hosts import HOST_NAMES, Host, Network, namespaces, pid_gone, run_prefix, sweep_stale
from tests.integration.rollout_estate import WARM, OpenLoop, Sent, wait_until, write_site

pytestmark = pytest.mark.servers

SERVE = [sys.executable, "-m", "http.server", "--bind"]


def reaches(client: Host, address: str, port: int) -> bool:
    """Whether a connection from ``client`` to ``address:port`` is accepted (within a second)."""
    with client.network():
        try:
            with socket.create_connection((address, port), timeout=1):
                return True
        except OSError:
            return False


@contextmanager
def http_server(host: Host, address: str) -> Iterator[int]:
    """A plain HTTP server on ``host`` bound to ``address``, until the block ends; its port."""
    port = host.free_port()
    process = host.popen([*SERVE, address, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield port
    finally:
        process.terminate()
        process.wait(10)


def test_hosts_reach_each_other_by_address_only_and_a_cut_parts_two_hosts_and_no_others(hosts: Network) -> None:
    control, store, edge = hosts["control"], hosts["store"], hosts["edge-1"]
    assert len({host.address for host in hosts.hosts.values()}) == len(HOST_NAMES)
    assert all(host.address.startswith("198.18.") for host in hosts.hosts.values())
    with http_server(store, store.address) as on_store, http_server(control, control.address) as on_control, \
            http_server(edge, "127.0.0.1") as on_loopback:
        wait_until(lambda: reaches(control, store.address, on_store), 30, "control reaches store's server")
        wait_until(lambda: reaches(store, control.address, on_control), 30, "store reaches control's server")
        wait_until(lambda: reaches(edge, "127.0.0.1", on_loopback), 30, "edge-1 reaches its own loopback")
        # Loopback is each host's own: edge-1's server is not on control's 127.0.0.1, nor on edge-1's address.
        assert not reaches(control, "127.0.0.1", on_loopback)
        assert not reaches(control, edge.address, on_loopback)

        control.cut_from(store)
        assert not reaches(control, store.address, on_store)
        assert not reaches(store, control.address, on_control)
        assert reaches(edge, store.address, on_store) and reaches(edge, control.address, on_control)
        control.heal(store)
        assert reaches(control, store.address, on_store) and reaches(store, control.address, on_control)

        store.cut()  # the whole host
        assert not reaches(control, store.address, on_store) and not reaches(edge, store.address, on_store)
        assert reaches(edge, control.address, on_control)
        store.heal()
        wait_until(lambda: reaches(control, store.address, on_store), 30, "store back after its link comes up")
    # Nothing this test started runs on: each server ended with its block.
    assert hosts.leftovers() == {}


def test_a_host_has_only_its_own_address_its_own_folder_and_its_own_environment(hosts: Network) -> None:
    for host in hosts.hosts.values():
        # Its one interface besides loopback carries one 198.18 address, and it routes to nothing else.
        addresses = host.run(["ip", "-o", "-4", "addr", "show"]).stdout.split("\n")
        assert sorted(line.split()[3] for line in addresses if line) == ["127.0.0.1/8", f"{host.address}/24"]
        routes = [line for line in host.run(["ip", "-4", "route", "show"]).stdout.splitlines() if line]
        assert [line.split()[0] for line in routes] == ["198.18.0.0/24"], routes
        assert host.run(["ip", "-6", "route", "show", "default"]).stdout.strip() == ""
    control = hosts["control"]
    assert not reaches(control, "192.0.2.1", 80)  # an address outside: no route from any host
    printed = control.run(["env"])
    assert printed.returncode == 0
    env = dict(line.split("=", 1) for line in printed.stdout.splitlines() if "=" in line)
    assert env["HOME"] == str(control.folder) and "PYTEST_CURRENT_TEST" in os.environ
    assert "PYTEST_CURRENT_TEST" not in env  # nothing of the test process's environment but PATH
    assert control.run(["pwd"]).stdout.strip() == str(control.folder)


def test_closing_the_hosts_ends_every_process_on_them_and_deletes_them(tmp_path: Path) -> None:
    network = Network.create(f"{run_prefix()}t", ("a", "b"), tmp_path)
    names = [host.netns for host in network.hosts.values()] + [network.bridge]
    # One that ends on SIGTERM, one that ignores it (the cleanup kills it).
    # Stand-ins that wait for a signal, never for time: the cleanup is what must end them.
    waits = "import signal; signal.pause()"
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.pause()"
    try:
        started = [network["a"].popen([sys.executable, "-c", waits]),
                   network["b"].popen([sys.executable, "-c", stubborn])]
        wait_until(lambda: all(network[name].pids() for name in ("a", "b")), 30, "both processes on their hosts")
    finally:
        network.close(grace_s=1)
    for process in started:
        process.wait(10)  # reaped: the cleanup ended it
        assert pid_gone(process.pid)
    assert not set(names) & set(namespaces())


def test_a_run_killed_hard_leaves_namespaces_the_next_run_deletes(hosts: Network, tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    leftover = Network.create(run_prefix(gone.pid), ("a",), tmp_path)  # as if made by a run now gone
    names = {leftover["a"].netns, leftover.bridge}
    try:
        process = leftover["a"].popen([sys.executable, "-c", "import signal; signal.pause()"])
        wait_until(leftover["a"].pids, 30, "a process on the leftover host")
        assert names <= set(sweep_stale())
        process.wait(15)  # ended by the sweep
    finally:
        leftover.close()  # nothing left to do after a sweep
    assert not names & set(namespaces())
    # The namespaces of a run whose owner is alive (this one) stay.
    assert {host.netns for host in hosts.hosts.values()} | {hosts.bridge} <= set(namespaces())


# --- the data plane across hosts -------------------------------------------------------------------

ROUTE = "hosts"
# What each host holding an S3 client is given by its operator: the store's credentials (moto takes any).
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
PEM_BLOCK = re.compile(r"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----\n", re.S)


@dataclass(frozen=True)
class Plane:
    """The store host's S3 server with the zoo's revisions published on it, an agent on each gpu host, and
    gpu-1's agent serving stable."""

    s3: str  # the S3 endpoint on store
    routes: str  # the route store's URL
    records: str  # the record sink's URL
    stable: RevisionTarget
    digests: dict[str, str] = field(default_factory=dict)  # published revision name: manifest digest
    agents: dict[str, str] = field(default_factory=dict)  # gpu host name: its agent's URL

    @property
    def route_store(self) -> RouteStore:
        return open_route_store(self.routes)


@contextmanager
def s3_server(store: Host) -> Iterator[str]:
    """moto's S3 server on ``store``, bound to its address; its endpoint."""
    port = store.free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", store.address, "-p", str(port)]
    with processes.service(argv, f"{store.url(port)}/", store.folder / "moto.log", at=store.placement()):
        yield store.url(port)


def publish_on(s3: str, zoo_dir: Path, names: Sequence[str], folder: Path) -> tuple[dict[str, str], Path]:
    """Sign the zoo revisions ``names`` with a publisher key made in ``folder`` and push them to the store's
    artifact bucket; their manifest digests and the public key."""
    key, public = signing_key(folder / "keys")
    revisions, digests = load_revisions(zoo_dir), {}
    for name in names:
        model_dir = zoo_dir / revisions[name].path
        manifest = build_manifest(model_dir)
        signature = folder / "signatures" / f"{manifest.digest[7:19]}.sig"
        signature.parent.mkdir(parents=True, exist_ok=True)
        sign_with_key(manifest, signature, key, model_name=model_dir.name)
        digests[name] = open_store("s3://artifacts/zoo", endpoint_url=s3).push(model_dir, manifest, signature)
    return digests, public


def provision(host: Host, source: Path, relative: str) -> Path:
    """An operator's copy of ``source`` (a trust key, a token) at ``relative`` in ``host``'s folder, owner-only."""
    copy = host.folder / relative
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, copy)
    copy.chmod(0o600)
    return copy


# Every host that checks a signature has the publisher's key at this path in its own folder, as an operator
# provisions a trust anchor at one path on each host; relative paths begin in each part's own folder.
TRUST = "trust/publisher.pub"
AGENT_TOKEN = "tokens/agents"  # the fleet's agent token: each agent's own copy, and control's
ADMIN_TOKEN = "tokens/edge-admin"  # the routers' admin token, likewise
PUBLISHED = ("stable", "improved", "slice-regressed")


def start_stable(agent: WorkerClient, s3: str, digest: str) -> RevisionTarget:
    """A new replica of the published stable revision on ``agent``, loaded from the store's S3; its route target."""
    revision = ServiceRevision(name="stable", artifact=open_store("s3://artifacts/zoo", endpoint_url=s3)
                               .get_manifest(digest), runtime=engine_runtime(Path(".venv-engine")),
                               execution=EXECUTION, interface=InterfacePolicy())
    view = start_replica(agent, ReplicaRequest(revision=revision, store="s3://artifacts/zoo",
                                               signature_policy=SignaturePolicySpec(kind="key", public_key=TRUST),
                                               warm=WARM))
    return RevisionTarget(fingerprint=revision.fingerprint, endpoints=(str(view.endpoint),),
                          served_model=str(view.served_model))


@pytest.fixture(scope="module")
def plane(hosts: Network, zoo_dir: Path) -> Iterator[Plane]:
    """S3 on ``store`` with the zoo's revisions; a worker agent on ``gpu-1`` and on ``gpu-2``, each loading
    from the store's S3, and on ``gpu-1`` one replica of stable."""
    control, store = hosts["control"], hosts["store"]
    for name, value in S3_CREDENTIALS.items():
        os.environ.setdefault(name, value)  # control's own S3 client
    with ExitStack() as stack:
        with control.network():
            s3 = stack.enter_context(s3_server(store))
            client = boto3.client("s3", endpoint_url=s3)
            for bucket in ("artifacts", "routes", "records"):
                client.create_bucket(Bucket=bucket)
            digests, public = publish_on(s3, zoo_dir, PUBLISHED, control.folder / "publisher")
            provision(control, public, TRUST)
            held = processes.token_file(control.folder / AGENT_TOKEN)
            processes.token_file(control.folder / ADMIN_TOKEN)
            agents = {}
            for name in ("gpu-1", "gpu-2"):
                # Provisioned on each gpu host by its operator: the publisher's key and the fleet's agent token.
                gpu = hosts[name]
                provision(gpu, public, TRUST)
                token = provision(gpu, held, AGENT_TOKEN)
                at = gpu.placement(**S3_CREDENTIALS, AWS_ENDPOINT_URL=s3)
                agents[name] = stack.enter_context(processes.worker_agent(gpu.folder / "worker", token, at=at))
            stable = start_stable(WorkerClient(agents["gpu-1"], held.read_text().strip()), s3, digests["stable"])
        assert stable.endpoints[0].startswith(f"http://{hosts['gpu-1'].address}:"), stable  # on gpu-1's address
        yield Plane(s3, f"s3://routes/live?endpoint_url={s3}", f"s3://records/live?endpoint_url={s3}", stable,
                    digests, agents)
    assert hosts.leftovers() == {}, "a part of this module still runs on its host"


def generation_of(plane: Plane, generation: int) -> RouteSnapshot:
    return RouteSnapshot(route=ROUTE, generation=generation, stable=plane.stable, created_by="operator",
                         created_at=datetime.now(UTC), reveal_revision=True)


@dataclass(frozen=True)
class Edge:
    """A router on an edge host, as control reaches it."""

    name: str
    public: str
    admin: str
    token: str
    signer: str  # its record-signing public key (PEM); the private key stays on the edge

    def health(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.admin}/admin/health", headers={"Authorization": f"Bearer {self.token}"}, timeout=10)
        answer.raise_for_status()
        return dict(answer.json())

    def store_unavailable(self, route: str = ROUTE) -> int:
        """How often its polls of ``route`` found the route store unreachable (from its /metrics)."""
        text = httpx.get(f"{self.admin}/metrics", timeout=10).text
        found = re.search(r'^revgate_router_store_unavailable_total\{route="' + route + r'"\} (\d+)$', text, re.M)
        return int(found.group(1)) if found else 0


@contextmanager
def edge_router(edge: Host, routes: str, records: str, route: str = ROUTE, *, control: Host) -> Iterator[Edge]:
    """``revgate router`` on ``edge``: the route from the store's S3, its records to the S3 sink signed with
    a key made on the edge, the admin token control holds provisioned on it; control learns its public key
    (the private key stays on the edge)."""
    key = f"router-{route}.key"  # a key of its own per route (an existing key is never overwritten)
    made = edge.run([sys.executable, "-m", "revgate.cli.main", "router-key", key])
    assert made.returncode == 0, made.stderr
    signer = PEM_BLOCK.search(made.stdout)
    assert signer, made.stdout
    held = control.folder / ADMIN_TOKEN
    token = provision(edge, held, ADMIN_TOKEN)
    at = edge.placement(**S3_CREDENTIALS)
    with processes.router(routes, route, edge.folder / f"router-{route}", token, sink=records,
                          router_id=edge.name, records_key=edge.folder / key, at=at) as (public, admin):
        yield Edge(edge.name, public, admin, held.read_text().strip(), signer.group(0))


def answered(traffic: OpenLoop, after: int = 0) -> list[Sent]:
    """Requests from the ``after``-th on that have had their 200."""
    return [item for item in traffic.sent[after:] if item.answered.is_set() and item.status == 200]


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_an_edge_cut_from_the_store_serves_its_snapshot_and_catches_up_when_healed(
    hosts: Network, plane: Plane
) -> None:
    control, store, cut_edge = hosts["control"], hosts["store"], hosts["edge-1"]
    with control.network():
        plane.route_store.write(generation_of(plane, 1))
        with edge_router(cut_edge, plane.routes, plane.records, control=control) as one, \
                edge_router(hosts["edge-2"], plane.routes, plane.records, control=control) as two:
            traffic = {one.name: OpenLoop(one.public, rate=4.0), two.name: OpenLoop(two.public, rate=4.0)}
            with traffic[one.name].running(), traffic[two.name].running():
                for name, loop in traffic.items():
                    wait_until(lambda loop=loop: len(answered(loop)) >= 5, 120, f"users served through {name}")

                cut_edge.cut_from(store)
                try:
                    # edge-1 has found the store gone: a poll of the route store failed.
                    noticed = wait_until(one.store_unavailable, 60, "edge-1's poll failing on the cut")
                    mark = len(traffic[one.name].sent)
                    plane.route_store.write(generation_of(plane, 2))
                    wait_until(lambda: two.health()["generation"] == 2, 60, "edge-2 serving generation 2")
                    # Polls of edge-1 after generation 2 was written failed too, and it serves its snapshot.
                    wait_until(lambda: one.store_unavailable() >= noticed + 2, 60, "edge-1 polling on the cut")
                    assert one.health()["generation"] == 1
                    wait_until(lambda: len(answered(traffic[one.name], mark)) >= 8, 60,
                               "users served through edge-1 while it is cut from the store")
                    assert one.health()["generation"] == 1
                    # Its records could not be written meanwhile: it holds them (the sink tried and failed).
                    wait_until(lambda: one.health()["sinks"]["requests"]["failures"] > 0, 60,
                               "edge-1's record sink failing on the cut")
                finally:
                    cut_edge.heal(store)
                wait_until(lambda: one.health()["generation"] == 2, 90, "edge-1 catching up once healed")
                healed = len(traffic[one.name].sent)
                wait_until(lambda: any(item.generation == 2 for item in answered(traffic[one.name], healed)), 60,
                           "users served generation 2 through edge-1")

            history = list(plane.route_store.history(ROUTE))
            counts = {name: {"sent": len(loop.sent), "failed": len(loop.failed()), "off_route": len(
                loop.off_route(history))} for name, loop in traffic.items()}
            print("requests per router:", counts)
            assert all(count["sent"] > 0 and count["failed"] == 0 and count["off_route"] == 0
                       for count in counts.values()), counts

            # Every request either edge served is in the store's record sink, in objects its own key signed,
            # those edge-1 held while cut included.
            reader = RecordReader(open_record_store(plane.records), ROUTE, "requests", lambda d: RequestRecord(**d),
                                  keys={edge.name: load_public_key(edge.signer, edge.name) for edge in (one, two)})
            records: list[RequestRecord] = []

            def all_recorded() -> bool:
                read = reader.read()
                assert read.problems == [], read.problems
                records.extend(read.records)
                return all(reader.totals.get(name, 0) >= count["sent"] for name, count in counts.items())

            wait_until(all_recorded, 60, "every request's record in the sink")
            sinks = {edge.name: edge.health()["sinks"]["requests"] for edge in (one, two)}
            assert all(sink["ok"] and sink["signed"] and sink["dropped"] == 0 for sink in sinks.values()), sinks
            assert {name: reader.totals[name] for name in counts} == {n: c["sent"] for n, c in counts.items()}
            assert {record.revision for record in records} == {plane.stable.fingerprint}
    # Control holds copies of tokens and public keys only: no router files, no record-signing key.
    assert not [path for path in control.folder.rglob("*") if "router" in path.name], list(control.folder.rglob("*"))


# --- a whole rollout across hosts ------------------------------------------------------------------

FLEET = "fleet"
RUN_S = 1500  # one rollout on a busy two-core machine: two candidate replicas load and warm, shadow, canary
SUBMITTED = re.compile(r"\(([0-9a-f-]{36})\) submitted to promote/promote-revision")
APPROVER = "rm@example.com"
FLEET_LEASE_S = 30  # a lease renewed every 10 s: a Prefect outage of 75 s spans seven renewals
# Two minutes: longer than the route lock's shortest lease (60 s, Prefect's floor), so the lock's lease ends
# while Prefect is away and the flow must take it again once Prefect is back.
PREFECT_OUTAGE_S = 120


class PrefectHost:
    """``prefect server start`` on the ``prefect`` host, stopped and started again on the same port and
    database as its operator would (an outage, then the same server back)."""

    def __init__(self, host: Host) -> None:
        self.host, self.port = host, host.free_port()
        self._running = ExitStack()

    def start(self) -> str:
        """Start it (readiness asked from control, as every client reaches it); its API URL."""
        env = self._running.enter_context(processes.prefect_server(self.host.folder / "prefect",
                                                                   at=self.host.placement(), port=self.port))
        return env["PREFECT_API_URL"]

    def stop(self) -> None:
        self._running.close()


class LedgerHost:
    """``mlflow server`` over a SQLite store on the ``ledger`` host, the evidence files kept there too (the
    server proxies them); stopped and started again on the same port and store, as its operator would."""

    def __init__(self, host: Host) -> None:
        self.host, self.port = host, host.free_port()
        self._running = ExitStack()

    def start(self) -> str:
        """Start it (readiness asked from control); its tracking URL."""
        return self._running.enter_context(processes.mlflow_ui(
            f"sqlite:///{self.host.folder / 'mlflow.db'}", self.host.folder / "mlflow.log", at=self.host.placement(),
            port=self.port))

    def stop(self) -> None:
        self._running.close()


@dataclass(frozen=True)
class Services:
    """The Prefect server on ``prefect`` and the MLflow tracking server on ``ledger``, as control reaches them."""

    prefect_api: str
    tracking: str
    prefect: PrefectHost
    ledger: LedgerHost


@pytest.fixture(scope="module")
def services(hosts: Network) -> Iterator[Services]:
    """``prefect server start`` on ``prefect``; ``mlflow server`` over a SQLite store on ``ledger``, the evidence
    files kept there too (the server proxies them)."""
    with hosts["control"].network(), ExitStack() as stack:
        server, ledger = PrefectHost(hosts["prefect"]), LedgerHost(hosts["ledger"])
        stack.callback(server.stop)
        stack.callback(ledger.stop)
        api, tracking = server.start(), ledger.start()
        yield Services(api, tracking, server, ledger)


def fleet_plan(approver_key: Path) -> RolloutPlan:
    """The demo's stages (shadow, approval, a 50% canary with its gates), approved by a named release manager
    with a signed answer, a candidate replica on each agent, one replica's capacity stated, a watched window."""
    return demo_plan().model_copy(update={
        "approvers": (APPROVER,), "signed_approval": True, "approver_keys": {APPROVER: approver_key.read_text()},
        "candidate_replicas": 2, "replica_capacity_rps": Decimal("10"), "rollback_window_seconds": 15,
        "lease_seconds": FLEET_LEASE_S})


def control_env(control: Host, plane: Plane, services: Services) -> dict[str, str]:
    """What control's operator sets for the Prefect worker, ``revgate`` commands and the runs: the Prefect
    server, the site configuration (its relative paths begin in control's folder), the store's credentials."""
    return {"PREFECT_API_URL": services.prefect_api, "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_LOGGING_LEVEL": "INFO", "REVGATE_HOME": str(control.folder),
            "REVGATE_SITE": str(control.folder / "site.json"), "AWS_ENDPOINT_URL": plane.s3, **S3_CREDENTIALS}


@contextmanager
def prefect_worker(control: Host, env: dict[str, str]) -> Iterator[None]:
    """``revgate deploy`` from control, then ``prefect worker start --pool revgate`` on control."""
    done = control.run([sys.executable, "-m", "revgate.cli.main", "deploy"], env=env, timeout=300)
    assert done.returncode == 0 and "work pool revgate" in done.stdout, done.stdout + done.stderr
    with (control.folder / "worker.log").open("ab") as log:
        worker = control.popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", "revgate"], env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        processes.stop(worker)


def ready_replicas(control: Host, plane: Plane, fingerprint: str) -> list[str]:
    """The ready replicas of revision ``fingerprint`` on the module's agents, as control's agent client sees them."""
    token = (control.folder / AGENT_TOKEN).read_text().strip()
    return [r.replica_id for url in plane.agents.values() for r in WorkerClient(url, token).replicas()
            if r.revision == fingerprint and r.state == "ready"]


def run_state(services: Services, flow_run_id: str) -> str:
    """The flow run's state type, from the Prefect server's REST API."""
    answer = httpx.get(f"{services.prefect_api}/flow_runs/{flow_run_id}", timeout=10)
    answer.raise_for_status()
    return str((answer.json().get("state") or {}).get("type", ""))


def prefect_outage(services: Services, routes: str, lease_seconds: int) -> list[RouteSnapshot]:
    """The Prefect server stopped (its host still up) until the route store shows the rollout's leases renewed
    ``PREFECT_OUTAGE_S`` after it went down, then started again on the same port and database; the route's
    snapshots written meanwhile."""
    store, before = open_route_store(routes), open_route_store(routes).read(FLEET)
    services.prefect.stop()
    down_at = datetime.now(UTC)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{services.prefect_api}/health", timeout=5)

    def renewed_through_outage() -> bool:
        current = store.read(FLEET)
        held = current.shadow or current.candidate
        assert held is not None, f"the rollout's revision left the route while Prefect was down: {current}"
        return (held.lease_expires_at - down_at).total_seconds() >= PREFECT_OUTAGE_S + lease_seconds

    wait_until(renewed_through_outage, PREFECT_OUTAGE_S + 4 * lease_seconds,
               f"the leases renewed {PREFECT_OUTAGE_S} s into the Prefect outage", every_s=2)
    assert services.prefect.start() == services.prefect_api
    return [s for s in store.history(FLEET) if s.generation > before.generation]


def promote_on_control(control: Host, env: dict[str, str], candidate: str, services: Services,
                       approver_key: Path, *, outage: Callable[[], object] | None = None) -> tuple[int, str, str]:
    """``revgate promote fleet CANDIDATE`` on control, followed to its end; when the run pauses for approval,
    ``outage`` (if any), then the release manager's ``revgate approve`` (signed with their key) from control.
    Exit code, output, run id."""
    output = control.folder / f"promote-{candidate}.out"
    with output.open("w") as sink:
        command = control.popen([sys.executable, "-m", "revgate.cli.main", "promote", FLEET, candidate,
                                 "--requested-by", "ana"], env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        submitted = wait_until(lambda: SUBMITTED.search(output.read_text(errors="replace")), 120,
                               "the run submitted to the deployment")
        flow_run_id = submitted.group(1)
        deadline = time.monotonic() + RUN_S

        def paused_or_done() -> bool:
            return command.poll() is not None or run_state(services, flow_run_id) == "PAUSED"

        wait_until(paused_or_done, RUN_S, "the run paused for approval", every_s=1)
        if command.poll() is None and outage is not None:
            outage()
            wait_until(paused_or_done, 120, "the run still paused for approval once Prefect is back", every_s=1)
        # The approval, then any "gates inconclusive: proceed anyway?" at a stage's limit: the release manager
        # answers each after reading the evidence, as in production (the live view shows the gates).
        while command.poll() is None and time.monotonic() < deadline:
            answer = control.run([sys.executable, "-m", "revgate.cli.main", "approve", flow_run_id,
                                  "--key", str(approver_key), "--as", APPROVER, "--comment", "evidence read"],
                                 env=env, timeout=120)
            assert answer.returncode == 0, answer.stdout + answer.stderr
            wait_until(lambda: command.poll() is not None or run_state(services, flow_run_id) != "PAUSED", 120,
                       "the run going on after the answer", every_s=1)
            wait_until(paused_or_done, max(1.0, deadline - time.monotonic()), "the run's next pause or its end",
                       every_s=1)
        try:
            command.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {RUN_S} s:\n{output.read_text()[-4000:]}") from None
    finally:
        if command.poll() is None:
            command.kill()
        command.wait(30)
    return command.returncode, output.read_text(errors="replace"), flow_run_id


def fleet_status(control: Host, env: dict[str, str], routes: str, *, routers: list[str], agents: list[str],
                 services: Services) -> dict[str, Any]:
    """``revgate status fleet --json`` on control over both routers and both agents (its exit code checked)."""
    argv = [sys.executable, "-m", "revgate.cli.main", "status", FLEET, "--routes", routes,
            "--router-token-file", ADMIN_TOKEN, "--worker-token-file", AGENT_TOKEN, "--tracking-uri", services.tracking,
            "--prefect-api", services.prefect_api, "--json", "--timeout", "10"]
    argv += [arg for url in routers for arg in ("--router", url)] + [arg for url in agents for arg in ("--worker", url)]
    result = control.run(argv, env=env, timeout=180)
    assert result.returncode == 0 and result.stdout.strip(), result.stdout[-2000:] + result.stderr[-3000:]
    return dict(json.loads(result.stdout))


def evidence_files(services: Services, flow_run_id: str, into: Path) -> tuple[Any, dict[str, Any]]:
    """The evidence run of a flow run in the ledger's tracking server, and its evidence files by name."""
    client = MlflowClient(services.tracking)
    experiment = client.get_experiment_by_name(f"revgate/{FLEET}")
    assert experiment is not None
    run = next(r for r in client.search_runs([experiment.experiment_id])
               if r.data.tags.get("prefect_flow_run_id") == flow_run_id)
    into.mkdir(parents=True, exist_ok=True)
    files = {}
    for item in client.list_artifacts(run.info.run_id, "evidence"):
        name = item.path.removeprefix("evidence/").removesuffix(".json")
        if Path(item.path).suffix not in (".json", ".md", ".txt"):
            continue  # a chart
        local = Path(client.download_artifacts(run.info.run_id, item.path, str(into)))
        files[name] = json.loads(local.read_text()) if local.suffix == ".json" else local.read_text()
    return run, files


@pytest.mark.engine
@pytest.mark.gated
@pytest.mark.timeout(RUN_S + 900)
def test_promote_revision_across_hosts_promotes_an_improvement_through_a_prefect_outage_in_its_approval(
    hosts: Network, plane: Plane, services: Services, tmp_path: Path
) -> None:
    control = hosts["control"]
    routes, records = f"s3://routes/{FLEET}?endpoint_url={plane.s3}", f"s3://records/{FLEET}?endpoint_url={plane.s3}"
    approver_key, approver_public = signing_key(tmp_path / "release-manager", "rm")  # the release manager's own
    write_trace(generate_trace(1200, rate=40.0, seed=7), control.folder / "trace.jsonl")  # the probes' trace
    with control.network():
        open_route_store(routes).write(RouteSnapshot(route=FLEET, generation=1, stable=plane.stable, created_by="seed",
                                                     created_at=datetime.now(UTC), reveal_revision=True))
        with edge_router(hosts["edge-1"], routes, records, FLEET, control=control) as one, \
                edge_router(hosts["edge-2"], routes, records, FLEET, control=control) as two:
            # The site configuration on control: every part by its host's address; files relative to control's folder.
            spec = PromotionSpec(
                route=FLEET, candidate_manifest=plane.digests["improved"], candidate_name="improved",
                artifact_store="s3://artifacts/zoo", route_store=routes,
                signature=SignaturePolicySpec(kind="key", public_key=TRUST), execution=EXECUTION, warm=WARM,
                gate_policy=demo_policy(), plan=fleet_plan(approver_public), worker_url=plane.agents["gpu-1"],
                more_workers=(plane.agents["gpu-2"],), worker_token_file=AGENT_TOKEN, router_url=one.public,
                router_admin_url=one.admin, more_routers=(two.admin,), router_sync_s=60,
                router_admin_token_file=ADMIN_TOKEN, records_sink=records,
                record_signers={edge.name: edge.signer for edge in (one, two)}, trace="trace.jsonl",
                tracking_uri=services.tracking, evidence_root="evidence", approval="ui", approval_timeout_s=900)
            env = control_env(control, plane, services)
            write_site(control.folder / "site.json", [spec])

            users = {edge.name: OpenLoop(edge.public, rate=1.5) for edge in (one, two)}
            with prefect_worker(control, env), users[one.name].running(), users[two.name].running():
                during: list[RouteSnapshot] = []
                code, printed, promoted_run = promote_on_control(
                    control, env, "improved", services, approver_key,
                    outage=lambda: during.extend(prefect_outage(services, routes, FLEET_LEASE_S)))
                assert code == 0 and printed.rstrip().endswith("decision: promoted"), printed[-4000:]
                assert "Downloading artifacts" not in printed  # the live view reads the reports without a bar each
                # `revgate promote` returns at the decision; the run goes on: the window, the drain, the close.
                # The ledger stopped at the promotion's commit: the promotion stands, the window watches, the old
                # stable is drained after it, and the run waits to close with its decision until the ledger is back.
                services.ledger.stop()
                wait_until(lambda: not ready_replicas(control, plane, plane.stable.fingerprint), 600,
                           "the old stable drained while the ledger is away", every_s=1)
                assert run_state(services, promoted_run) == "RUNNING"  # its evidence held, its run not closed
                standing = open_route_store(routes).read(FLEET)
                assert standing is not None and standing.stable.fingerprint != plane.stable.fingerprint
                assert services.ledger.start() == services.tracking
                wait_until(lambda: run_state(services, promoted_run) in ("COMPLETED", "FAILED", "CRASHED"), 600,
                           "the run's end once the ledger is back", every_s=1)
                assert run_state(services, promoted_run) == "COMPLETED"
                promoted = list(open_route_store(routes).history(FLEET))
                token = (control.folder / AGENT_TOKEN).read_text().strip()
                placed = {name: [r for r in WorkerClient(url, token).replicas()
                                 if r.revision == promoted[-1].stable.fingerprint and r.state == "ready"]
                          for name, url in plane.agents.items()}
                status = fleet_status(control, env, routes, routers=[one.admin, two.admin],
                                      agents=list(plane.agents.values()), services=services)
                run, evidence = evidence_files(services, promoted_run, tmp_path / "promoted")

                # A second run on the promoted route, of a candidate regressed on one slice: rolled back by its gate.
                code, said, regressed_run = promote_on_control(control, env, plane.digests["slice-regressed"],
                                                               services, approver_key)
                assert code != 0 and said.rstrip().endswith("decision: rolled_back"), said[-4000:]
                wait_until(lambda: run_state(services, regressed_run) in ("COMPLETED", "FAILED", "CRASHED"), 600,
                           "the regressed run's end", every_s=1)
                regressed, regressed_evidence = evidence_files(services, regressed_run, tmp_path / "regressed")
            history = list(open_route_store(routes).history(FLEET))

    # Users through both routers for both rollouts: none failed, none served by a revision not routed then.
    counts = {name: {"sent": len(loop.sent), "failed": len(loop.failed()), "off_route": len(loop.off_route(history))}
              for name, loop in users.items()}
    print("users per router:", counts)
    assert all(c["sent"] > 0 and c["failed"] == 0 and c["off_route"] == 0 for c in counts.values()), counts

    # Prefect down for two minutes of the approval pause: the leases were renewed all along, nothing else moved,
    # and the run went on to its promotion once Prefect was back.
    assert len(during) >= PREFECT_OUTAGE_S // (FLEET_LEASE_S // 3) - 2, [s.generation for s in during]
    away, back = printed.find("the Prefect API is away"), printed.find("the Prefect API is back")
    assert 0 <= away < back < printed.find("decision: promoted"), printed[-4000:]  # the live view said so
    assert all(s.shadow is not None and s.shadow.fingerprint == during[0].shadow.fingerprint  # type: ignore[union-attr]
               and s.candidate is None for s in during), during

    # The improvement: promoted, one candidate replica on each agent, each endpoint in its agent's failure domain.
    final = promoted[-1]
    assert final.stable.fingerprint != plane.stable.fingerprint and final.candidate is None and final.shadow is None
    assert final.created_by.startswith("ana (claimed; prefect flow run "), final.created_by
    assert all(len(replicas) == 1 for replicas in placed.values()), placed
    assert {url.rstrip("/") for url in final.stable.endpoints} == {
        str(r.endpoint).rstrip("/") for replicas in placed.values() for r in replicas}
    domain = {hosts[name].address: name for name in plane.agents}
    assert sorted(domain[d] for d in final.failure_domains.values()) == ["gpu-1", "gpu-2"], final.failure_domains
    assert all(f"//{address}:" in endpoint for endpoint, address in final.failure_domains.items())
    assert any(s.shadow is not None for s in promoted) and any(s.candidate is not None for s in promoted)

    # Its evidence, in the tracking server on ledger, names each host's part; its files are kept on ledger,
    # where an auditor on any host reads them, and none on control.
    kept = list((hosts["ledger"].folder / "mlflow-artifacts").rglob("decision.json"))
    assert len(kept) == 2, kept  # one per run
    assert not list((control.folder / "evidence").rglob("decision.json"))
    tags = run.data.tags
    assert run.info.status == "FINISHED" and tags["revgate.decision"] == "promoted", tags
    assert tags["revgate.step.approval"].startswith(f"approved by {APPROVER}, signed with key"), tags
    assert tags["revgate.rollback_window"].startswith("ended"), tags  # watched from the sink, not slept through
    assert evidence["agent-engine"]["agent"].rstrip("/") in {url.rstrip("/") for url in plane.agents.values()}
    replica_agents = sorted(domain[httpx.URL(f["worker_url"]).host] for n, f in evidence.items()
                            if n.startswith("replica-"))
    assert replica_agents == ["gpu-1", "gpu-2"], replica_agents
    synced = [f for n, f in evidence.items() if n.startswith("routers-generation-")]
    assert synced and all({httpx.URL(url).host for url in f["served"]} == {hosts["edge-1"].address,
                                                                          hosts["edge-2"].address} for f in synced)
    # The stage windows read both routers' signed records from the sink.
    notes = re.findall(r"records per router: ([^)]*)\)", json.dumps(evidence))
    assert notes and all(re.fullmatch(r"edge-1 \d+, edge-2 \d+", note) for note in notes), (notes, sorted(evidence))

    # revgate status from control: each router on the last generation, each agent with its ready replica.
    assert status["problems"] == [] and status["generation"] == promoted[-1].generation, status
    assert {r["generation"] for r in status["routers"]} == {promoted[-1].generation}, status["routers"]
    ready = {w["url"].rstrip("/"): [p["endpoint"].rstrip("/") for p in w["replicas"]
                                    if p["revision"] == final.stable.fingerprint and p["state"] == "ready"]
             for w in status["workers"] if w["reachable"]}
    assert ready == {plane.agents[name].rstrip("/"): [str(r.endpoint).rstrip("/") for r in placed[name]]
                     for name in plane.agents}, status["workers"]
    assert status["links"]["flow_run_id"] == promoted_run and status["links"]["decision"] == "promoted", status

    # The regressed candidate: rolled back by its quality gate on sort/long, the improvement stable throughout.
    assert regressed.info.status == "FINISHED" and regressed.data.tags["revgate.decision"] == "rolled_back"
    after = history[len(promoted):]
    assert after and all(s.stable.fingerprint == final.stable.fingerprint for s in after), after
    assert history[-1].candidate is None and history[-1].shadow is None
    failing = [gate for report in regressed_evidence.values() if isinstance(report, dict)
               for gate in report.get("gates", ()) if isinstance(gate, dict) and gate.get("outcome") == "fail"]
    slices = [s["slice"] for gate in failing if gate["gate"].startswith("quality") for s in gate.get("slices", ())
              if s["outcome"] == "fail"]
    assert slices and all("sort" in name and "long" in name for name in slices), failing


# --- faults across hosts, with the real flow ------------------------------------------------------

FAULTS = "faults"


def clean_slate(plane: Plane, token: str) -> RevisionTarget:
    """No replica on either agent but one ready replica of stable on ``gpu-1`` (started if none is); its target."""
    gpu1 = WorkerClient(plane.agents["gpu-1"], token)
    kept = next((r for r in gpu1.replicas() if r.revision == plane.stable.fingerprint and r.state == "ready"),
                None)
    for url in plane.agents.values():
        agent = WorkerClient(url, token)
        for replica in agent.replicas():
            if replica.state in ("loading", "warming", "ready") and replica != kept:
                agent.drain(str(replica.replica_id), 5)
        wait_until(lambda agent=agent: all(r.state != "draining" for r in agent.replicas()), 120,
                   f"{url}'s replicas drained")
    if kept is None:
        return start_stable(gpu1, plane.s3, plane.digests["stable"])
    return RevisionTarget(fingerprint=plane.stable.fingerprint, endpoints=(str(kept.endpoint),),
                          served_model=str(kept.served_model))


def failed_after(loop: OpenLoop, moment: float) -> list[Sent]:
    """Requests sent after ``moment`` (epoch seconds) that got no 200."""
    return [item for item in loop.failed() if item.sent_s > moment]


PARTITION = "partition"
PARTITION_LEASE_S = 20
STORE_SILENT_S = 30  # the store answers nothing for this long
SILENT_LEASE_S = 90  # a lease that outlives it


def faults_spec(plane: Plane, route: str, edges: Sequence[Edge], services: Services, *, plan: RolloutPlan,
                workers: Sequence[str]) -> PromotionSpec:
    """A rollout of ``improved`` on ``route`` from control, by the routers on ``edges``, on the agents of
    ``workers`` (gpu host names), approved by the plan alone."""
    routes, records = f"s3://routes/{route}?endpoint_url={plane.s3}", f"s3://records/{route}?endpoint_url={plane.s3}"
    first, *more = edges
    return PromotionSpec(
        route=route, candidate_manifest=plane.digests["improved"], candidate_name="improved",
        artifact_store="s3://artifacts/zoo", route_store=routes,
        signature=SignaturePolicySpec(kind="key", public_key=TRUST), execution=EXECUTION, warm=WARM,
        gate_policy=demo_policy(), plan=plan, worker_url=plane.agents[workers[0]],
        more_workers=tuple(plane.agents[name] for name in workers[1:]), worker_token_file=AGENT_TOKEN,
        router_url=first.public, router_admin_url=first.admin, more_routers=tuple(edge.admin for edge in more),
        router_sync_s=60, router_admin_token_file=ADMIN_TOKEN, records_sink=records,
        record_signers={edge.name: edge.signer for edge in edges}, trace="trace.jsonl",
        tracking_uri=services.tracking, evidence_root="evidence", approval="auto")


def canary_of(store: RouteStore, route: str, after: int = 0) -> RouteSnapshot | None:
    """The route, once a generation after ``after`` routes a share to a candidate."""
    now = store.read(route)
    return now if now is not None and now.generation > after and now.candidate is not None else None


def on_stable_since(loop: OpenLoop, stable: str, moment: float, count: int = 5) -> bool:
    """Whether the last ``count`` requests answered among those sent after ``moment`` were all stable's."""
    tail = answered(loop)
    tail = [item for item in tail if item.sent_s > moment][-count:]
    return len(tail) == count and all(item.revision == stable for item in tail)


@contextmanager
def frozen(host: Host) -> Iterator[None]:
    """Every process on ``host`` stopped (SIGSTOP) for the block, then let go on (SIGCONT): its connections
    are accepted and held, nothing is answered, and what was asked meanwhile is done once it goes on."""
    pids = host.pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def store_silent_for(store_host: Host, store: RouteStore, edges: Sequence[Edge], users: dict[str, OpenLoop], *,
                     stable: str, candidate: str) -> tuple[float, float]:
    """The store answering nothing for ``STORE_SILENT_S`` mid-canary, then back. The routers serve their last
    snapshot meanwhile (both revisions), and the rollout's renewals land once the store answers again.
    When the silence began, and when a lease renewed past it was seen in the store."""
    route = edges[0].health()["route"]
    failed = {edge.name: edge.store_unavailable(route) for edge in edges}
    with frozen(store_host):
        silent_at = time.time()
        # Each router's polls go unanswered, and it serves on from its snapshot: stable and the candidate.
        wait_until(lambda: all(edge.store_unavailable(route) > failed[edge.name] for edge in edges),
                   STORE_SILENT_S + 30, "every router's poll failing on the silent store")
        wait_until(lambda: all(len(loop.served_by(candidate, silent_at)) >= 2 and len(loop.served_by(
            stable, silent_at)) >= 2 for loop in users.values()), STORE_SILENT_S, "both revisions served meanwhile")
        threading.Event().wait(max(0.0, silent_at + STORE_SILENT_S - time.time()))  # the fault's own length
    back_at = time.time()

    def renewed() -> RouteSnapshot | None:
        now = store.read(route)
        return now if now is not None and now.candidate is not None and now.candidate.fingerprint == candidate \
            and now.candidate.lease_expires_at.timestamp() > back_at else None

    wait_until(renewed, 60, "the rollout's lease renewed once the store answers again")
    return silent_at, time.time()


@contextmanager
def promote_running(control: Host, argv: list[str], env: dict[str, str], log: str) -> Iterator[subprocess.Popen[Any]]:
    """``argv`` (a ``revgate promote``) on control, its output in ``log`` there; killed if still running at the end."""
    with (control.folder / log).open("w") as out:
        process = control.popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)


@pytest.mark.engine
@pytest.mark.timeout(2400)
def test_control_cut_from_every_host_mid_canary_leaves_stable_in_a_lease_then_a_new_rollout_rides_out_a_silent_store(
    hosts: Network, plane: Plane, services: Services
) -> None:
    control, watcher = hosts["control"], hosts["users"]
    token = (control.folder / AGENT_TOKEN).read_text().strip()
    (control.folder / "trace.jsonl").touch()
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Bake(seconds=900)], lease_seconds=PARTITION_LEASE_S,
                             lease_renew_seconds=1, rollback_window_seconds=0, replica_capacity_rps=Decimal("10"))
    routes, records = f"s3://routes/{PARTITION}?endpoint_url={plane.s3}", f"s3://records/{PARTITION}?endpoint_url={plane.s3}"
    # The test watches from the users' host: control, once cut, reaches no one and no one reaches it.
    with watcher.network():
        stable = clean_slate(plane, token)
        store = open_route_store(routes)
        store.write(RouteSnapshot(route=PARTITION, generation=1, stable=stable, created_by="seed",
                                  created_at=datetime.now(UTC), reveal_revision=True))
        with edge_router(hosts["edge-1"], routes, records, PARTITION, control=control) as one, \
                edge_router(hosts["edge-2"], routes, records, PARTITION, control=control) as two:
            spec = faults_spec(plane, PARTITION, (one, two), services, plan=plan, workers=["gpu-1"])
            (control.folder / "partition.json").write_text(spec.model_dump_json(indent=1))
            env = control_env(control, plane, services)
            write_site(control.folder / "site.json", [spec])  # what the operator's `revgate rollback` reads
            promote = [sys.executable, "-m", "revgate.cli.main", "promote", "partition.json"]
            users = {edge.name: OpenLoop(edge.public, rate=2.0) for edge in (one, two)}
            with users[one.name].running(), users[two.name].running():
                with promote_running(control, promote, env, "partition-1.out") as flow:
                    at_half = wait_until(lambda: canary_of(store, PARTITION), 900, "the canary at 50%")
                    assert at_half.candidate is not None
                    candidate = at_half.candidate.fingerprint
                    wait_until(lambda: all(len(loop.served_by(candidate)) >= 3 for loop in users.values()), 120,
                               "the candidate serving through both edges")
                    control.cut()
                    cut_at = time.time()
                    try:
                        held = store.read(PARTITION)  # the controller's last renewal before the cut
                        assert held is not None and held.candidate is not None
                        expires = held.candidate.lease_expires_at.timestamp()
                        assert expires - cut_at <= PARTITION_LEASE_S + 1, (cut_at, held.candidate)
                        # Nobody tells the routers: each reverts to stable once the lease it holds runs out.
                        wait_until(lambda: all(on_stable_since(loop, stable.fingerprint, expires + 2)
                                               for loop in users.values()), PARTITION_LEASE_S + 90,
                                   "every edge sending new requests to stable after the lease")
                        assert store.read(PARTITION) == held  # nothing reached the store from control
                    finally:
                        control.heal()
                    healed_at = time.time()
                    code = flow.wait(600)
                    first_out = (control.folder / "partition-1.out").read_text(errors="replace")
                    # It decided while cut (its replica watch heard from no agent for a lease) or once healed
                    # (its lease had run out): either way it ended its rollout, and routed back to stable.
                    assert code == 3 and "rollout stopped: " in first_out, first_out[-4000:]
                after_first = store.read(PARTITION)
                assert after_first is not None
                # Once healed, the route is free: a new rollout takes the lock and routes its own canary, with a
                # lease that outlives the store's silence to come.
                longer = plan.model_copy(update={"lease_seconds": SILENT_LEASE_S})
                (control.folder / "partition-2.json").write_text(
                    spec.model_copy(update={"plan": longer}).model_dump_json(indent=1))
                with promote_running(control, [*promote[:-1], "partition-2.json"], env, "partition-2.out") as second:
                    again = wait_until(lambda: canary_of(store, PARTITION, after_first.generation), 900,
                                       "the second rollout's canary")
                    wait_until(lambda: all(len(loop.served_by(candidate, again.created_at.timestamp())) >= 3
                                           for loop in users.values()), 120, "the second canary serving")
                    silent_at, renewed_at = store_silent_for(hosts["store"], store, (one, two), users,
                                                             stable=stable.fingerprint, candidate=candidate)
                    assert second.poll() is None, "the rollout ended while the store was silent"
                    operator = control.run([sys.executable, "-m", "revgate.cli.main", "rollback", "--routes", routes,
                                            "--route", PARTITION, "--created-by", "oncall", "--notify", one.admin,
                                            "--notify", two.admin, "--admin-token-file", ADMIN_TOKEN], env=env,
                                           timeout=120)
                    assert operator.returncode == 0, operator.stdout + operator.stderr
                    second_code = second.wait(600)
                    second_out = (control.folder / "partition-2.out").read_text(errors="replace")
                    assert second_code == 3 and "aborted by oncall" in second_out, second_out[-4000:]
            history = list(store.history(PARTITION))

    counts = {name: {"sent": len(loop.sent), "failed": len(loop.failed()),
                     "off_route": len(loop.off_route(history))} for name, loop in users.items()}
    last_candidate = max(item.sent_s for loop in users.values() for item in loop.served_by(candidate)
                         if item.sent_s < healed_at)
    print(f"users per router: {counts}; the cut's candidate last served a request sent "
          f"{last_candidate - cut_at:.2f} s after the cut (lease {PARTITION_LEASE_S} s, "
          f"{expires - cut_at:.2f} s of it left at the cut); the store silent {STORE_SILENT_S} s, a renewed lease "
          f"seen {renewed_at - silent_at - STORE_SILENT_S:.2f} s after it answered again")
    # No user's request failed, none was served off the route, through the cut, both rollouts and the rollback.
    assert all(c["sent"] > 0 and c["failed"] == 0 and c["off_route"] == 0 for c in counts.values()), counts
    # Stable within one lease of the cut, and the cut's candidate never served again: not once healed either.
    first_rollout_ends = again.created_at.timestamp()
    assert all(item.sent_s <= expires + 2 for loop in users.values() for item in loop.served_by(candidate)
               if item.sent_s < first_rollout_ends), "the candidate served past its lease"
    assert history[-1].candidate is None and history[-1].stable == stable and history[-1].created_by == "oncall"
    client = MlflowClient(services.tracking)
    runs = client.search_runs([client.get_experiment_by_name(f"revgate/{PARTITION}").experiment_id],
                              order_by=["attributes.start_time ASC"])
    assert [run.data.tags.get("revgate.decision") for run in runs] == ["rolled_back", "rolled_back"], [
        run.data.tags for run in runs]
    left = WorkerClient(plane.agents["gpu-1"], token).replicas()
    assert "ready" in [r.state for r in left if r.revision == stable.fingerprint]  # stable stayed ready
    assert not [r for r in left if r.revision == candidate and r.state == "ready"], left  # both drained


@pytest.mark.engine
@pytest.mark.timeout(1800)
def test_a_gpu_host_killed_mid_canary_costs_no_request_and_the_candidates_last_replica_killed_rolls_back(
    hosts: Network, plane: Plane, services: Services, tmp_path: Path
) -> None:
    control, gpu2 = hosts["control"], hosts["gpu-2"]
    routes, records = f"s3://routes/{FAULTS}?endpoint_url={plane.s3}", f"s3://records/{FAULTS}?endpoint_url={plane.s3}"
    token = (control.folder / AGENT_TOKEN).read_text().strip()
    (control.folder / "trace.jsonl").touch()
    with control.network():
        stable = clean_slate(plane, token)
        open_route_store(routes).write(RouteSnapshot(route=FAULTS, generation=1, stable=stable, created_by="seed",
                                                     created_at=datetime.now(UTC), reveal_revision=True))
        with edge_router(hosts["edge-1"], routes, records, FAULTS, control=control) as one, \
                edge_router(hosts["edge-2"], routes, records, FAULTS, control=control) as two:
            plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Bake(seconds=900)], lease_seconds=20,
                                     lease_renew_seconds=1, rollback_window_seconds=0, candidate_replicas=2,
                                     replica_capacity_rps=Decimal("10"))
            spec = faults_spec(plane, FAULTS, (one, two), services, plan=plan,
                               workers=["gpu-1", "gpu-2"])
            (control.folder / "faults.json").write_text(spec.model_dump_json(indent=1))
            env = control_env(control, plane, services)
            users = {edge.name: OpenLoop(edge.public, rate=2.0) for edge in (one, two)}
            with users[one.name].running(), users[two.name].running(), \
                    (control.folder / "faults.out").open("w") as out:
                flow = control.popen([sys.executable, "-m", "revgate.cli.main", "promote", "faults.json"], env=env,
                                     stdout=out, stderr=subprocess.STDOUT)
                try:
                    def canary() -> RouteSnapshot | None:
                        now = open_route_store(routes).read(FAULTS)
                        return now if now is not None and now.candidate is not None and len(
                            now.candidate.endpoints) == 2 else None

                    at_half = wait_until(canary, 900, "the canary at 50% on both agents")
                    assert at_half.candidate is not None
                    candidate = at_half.candidate.fingerprint
                    wait_until(lambda: all(len(loop.served_by(candidate)) >= 3 for loop in users.values()), 120,
                               "the candidate serving through both edges")
                    # Every process on gpu-2 killed: its agent, its engines, its replica proxies.
                    for pid in gpu2.pids():
                        os.kill(pid, signal.SIGKILL)
                    killed_host = time.time()
                    wait_until(lambda: not gpu2.pids(), 30, "nothing left running on gpu-2")
                    settled = killed_host + 1.0
                    wait_until(lambda: all(len(loop.served_by(candidate, after_s=settled + 5)) >= 3
                                           for loop in users.values()), 120,
                               "the candidate's replica on gpu-1 still serving through both edges")
                    # Then the candidate's last replica killed: its engine's process group on gpu-1, hard, as the
                    # kernel's OOM killer would. Its agent fails it and closes its proxy: connections refused.
                    last = next(view for view in WorkerClient(plane.agents["gpu-1"], token).replicas()
                                if view.revision == candidate and view.state == "ready")
                    assert last.pid is not None
                    os.killpg(last.pid, signal.SIGKILL)
                    killed_last = time.time()
                    assert flow.wait(300) == 3, (control.folder / "faults.out").read_text()[-3000:]
                    back = open_route_store(routes).read(FAULTS)
                    assert back is not None and back.candidate is None and back.stable == stable
                    rolled_back_at = back.created_at.timestamp()
                    wait_until(lambda: all(loop.sent[-1].status == 200 and loop.sent[-1].sent_s > rolled_back_at + 3
                                           for loop in users.values()), 60, "users answered after the rollback")
                finally:
                    if flow.poll() is None:
                        flow.kill()
                    flow.wait(30)
            history = list(open_route_store(routes).history(FAULTS))

    counts = {name: {"sent": len(loop.sent), "failed": len(loop.failed()),
                     "failed_1s_after_gpu2": len(failed_after(loop, settled)),
                     "off_stable_1s_after_last": len([item for item in loop.sent if item.sent_s > killed_last + 1.0
                                                      and (item.status != 200 or item.revision != stable.fingerprint)]),
                     "off_route": len(loop.off_route(history))} for name, loop in users.items()}
    print("users per router:", counts, "rolled back", round(rolled_back_at - killed_last, 2), "s after the last kill")
    # No new request failed once a second had passed after the host died, through the last kill and the rollback;
    # a second after the candidate's last replica died, every new request was on stable.
    assert all(c["failed_1s_after_gpu2"] == 0 and c["off_route"] == 0 and c["off_stable_1s_after_last"] == 0
               for c in counts.values()), counts
    run = MlflowClient(services.tracking).search_runs(
        [MlflowClient(services.tracking).get_experiment_by_name(f"revgate/{FAULTS}").experiment_id])[0]
    assert run.data.tags["revgate.decision"] == "rolled_back", run.data.tags
    stopped = run.data.tags["revgate.step.stopped"]
    # The fault named: which replica, on which agent, and how it died.
    assert last.replica_id in stopped and plane.agents["gpu-1"].rstrip("/") in stopped and "exited" in stopped, stopped
    assert "ready" in [r.state for r in WorkerClient(plane.agents["gpu-1"], token).replicas()
                       if r.revision == stable.fingerprint]  # stable never stopped being ready
