"""Parts on hosts of their own: the hosts fixture itself, then the data plane across hosts.

Each host is a network namespace (tests/integration/hosts.py). The first tests check what the later
ones rely on: a server on one host answers a client on another by its 198.18 address and on no
other; loopback is each host's own; a cut parts two hosts and no others; cleanup leaves no process
behind. The data-plane test runs moto's S3 server on ``store``, a worker agent with one vLLM replica
on ``gpu-1``, a router on ``edge-1`` and one on ``edge-2``, and users on ``control``; then ``edge-1``
loses ``store`` while serving.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from revgate.evaluation.records import RequestRecord
from revgate.flows import processes
from revgate.flows.demo import EXECUTION, signing_key
from revgate.flows.steps import start_replica
from revgate.manifests.revision import InterfacePolicy, ServiceRevision
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
from tests.integration.hosts import Host, Network, namespaces, pid_gone, run_prefix, sweep_stale
from tests.integration.rollout_estate import WARM, OpenLoop, Sent, wait_until

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
    assert len({host.address for host in hosts.hosts.values()}) == 8
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
    """The store host's S3 server with the stable revision published on it, and gpu-1's agent serving it."""

    s3: str  # the S3 endpoint on store
    routes: str  # the route store's URL
    records: str  # the record sink's URL
    stable: RevisionTarget

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


def publish_on(s3: str, zoo_dir: Path, name: str, folder: Path) -> tuple[str, Path]:
    """Sign the zoo revision ``name`` with a publisher key made in ``folder`` and push it to the store's
    artifact bucket; its manifest digest and the public key."""
    key, public = signing_key(folder / "keys")
    model_dir = zoo_dir / load_revisions(zoo_dir)[name].path
    manifest = build_manifest(model_dir)
    signature = folder / "signatures" / f"{manifest.digest[7:19]}.sig"
    signature.parent.mkdir(parents=True, exist_ok=True)
    sign_with_key(manifest, signature, key, model_name=model_dir.name)
    return open_store("s3://artifacts/zoo", endpoint_url=s3).push(model_dir, manifest, signature), public


@pytest.fixture(scope="module")
def plane(hosts: Network, zoo_dir: Path) -> Iterator[Plane]:
    """S3 on ``store``; on ``gpu-1`` a worker agent with one replica of stable, loaded from the store's S3."""
    control, store, gpu = hosts["control"], hosts["store"], hosts["gpu-1"]
    for name, value in S3_CREDENTIALS.items():
        os.environ.setdefault(name, value)  # control's own S3 client
    with ExitStack() as stack:
        with control.network():
            s3 = stack.enter_context(s3_server(store))
            client = boto3.client("s3", endpoint_url=s3)
            for bucket in ("artifacts", "routes", "records"):
                client.create_bucket(Bucket=bucket)
            digest, public = publish_on(s3, zoo_dir, "stable", control.folder / "publisher")
            # Provisioned on gpu-1 by its operator: the publisher's public key (its trust anchor) and the
            # agent's token, whose copy control holds to call the agent.
            trust = gpu.folder / "trust" / "publisher.pub"
            trust.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(public, trust)
            token = processes.token_file(gpu.folder / "agent-token")
            held = control.folder / "gpu-1-token"
            shutil.copyfile(token, held)
            at = gpu.placement(**S3_CREDENTIALS, AWS_ENDPOINT_URL=s3)
            agent = stack.enter_context(processes.worker_agent(gpu.folder / "worker", token, at=at))
            revision = ServiceRevision(name="stable", artifact=open_store("s3://artifacts/zoo", endpoint_url=s3)
                                       .get_manifest(digest), runtime=engine_runtime(Path(".venv-engine")),
                                       execution=EXECUTION, interface=InterfacePolicy())
            view = start_replica(WorkerClient(agent, held.read_text().strip()), ReplicaRequest(
                revision=revision, store="s3://artifacts/zoo",
                signature_policy=SignaturePolicySpec(kind="key", public_key=str(trust)), warm=WARM))
        stable = RevisionTarget(fingerprint=revision.fingerprint, endpoints=(str(view["endpoint"]),),
                                served_model=str(view["served_model"]))
        assert stable.endpoints[0].startswith(f"http://{gpu.address}:"), stable  # reached on gpu-1's address
        yield Plane(s3, f"s3://routes/live?endpoint_url={s3}", f"s3://records/live?endpoint_url={s3}", stable)
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

    def store_unavailable(self) -> int:
        """How often its polls found the route store unreachable (from its /metrics)."""
        text = httpx.get(f"{self.admin}/metrics", timeout=10).text
        found = re.search(r'^revgate_router_store_unavailable_total\{route="' + ROUTE + r'"\} (\d+)$', text, re.M)
        return int(found.group(1)) if found else 0


@contextmanager
def edge_router(edge: Host, plane: Plane) -> Iterator[Edge]:
    """``revgate router`` on ``edge``: the route from the store's S3, its records to the S3 sink signed with
    a key made on the edge; control learns its admin token and its public key (the private key stays)."""
    made = edge.run([sys.executable, "-m", "revgate.cli.main", "router-key", "router.key"])
    assert made.returncode == 0, made.stderr
    signer = PEM_BLOCK.search(made.stdout)
    assert signer, made.stdout
    token = processes.token_file(edge.folder / "admin-token")
    at = edge.placement(**S3_CREDENTIALS)
    with processes.router(plane.routes, ROUTE, edge.folder / "router", token, sink=plane.records,
                          router_id=edge.name, records_key=edge.folder / "router.key", at=at) as (public, admin):
        yield Edge(edge.name, public, admin, token.read_text().strip(), signer.group(0))


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
        with edge_router(cut_edge, plane) as one, edge_router(hosts["edge-2"], plane) as two:
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
