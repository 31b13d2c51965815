"""Parts on hosts of their own: the hosts fixture itself, then the data plane across hosts.

Each host is a network namespace (tests/integration/hosts.py). The first tests check what the later
ones rely on: a server on one host answers a client on another by its 198.18 address and on no
other; loopback is each host's own; a cut parts two hosts and no others; cleanup leaves no process
behind. The data-plane test runs moto's S3 server on ``store``, a worker agent with one vLLM replica
on ``gpu-1``, a router on ``edge-1`` and one on ``edge-2``, and users on ``control``; then ``edge-1``
loses ``store`` while serving.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.hosts import Host, Network, namespaces, pid_gone, run_prefix, sweep_stale
from tests.integration.rollout_estate import wait_until

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


def test_closing_the_hosts_ends_every_process_on_them_and_deletes_them(tmp_path: Path) -> None:
    network = Network.create(f"{run_prefix()}t", ("a", "b"), tmp_path)
    names = [host.netns for host in network.hosts.values()] + [network.bridge]
    # One that ends on SIGTERM, one that ignores it (the cleanup kills it).
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    try:
        started = [network["a"].popen([sys.executable, "-c", "import time; time.sleep(600)"]),
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
    try:
        process = leftover["a"].popen([sys.executable, "-c", "import time; time.sleep(600)"])
        wait_until(leftover["a"].pids, 30, "a process on the leftover host")
        assert {leftover["a"].netns, leftover.bridge} <= set(sweep_stale())
        process.wait(15)  # ended by the sweep
    finally:
        leftover.close()  # nothing left to do after a sweep
    assert not {leftover["a"].netns, leftover.bridge} & set(namespaces())
    # The namespaces of a run whose owner is alive (this one) stay.
    assert {host.netns for host in hosts.hosts.values()} | {hosts.bridge} <= set(namespaces())
