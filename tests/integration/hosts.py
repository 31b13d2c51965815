"""Hosts for tests: each host a Linux network namespace of its own, on one bridge, on one machine.

A deployment runs its parts on hosts that share nothing but the network: ``control`` runs the flow,
``prefect`` the Prefect server, ``ledger`` the MLflow tracking server, ``store`` the S3 server
(artifacts, routes, records), ``gpu-1`` and ``gpu-2`` a worker agent each, ``edge-1`` and ``edge-2``
a router each. Here each host is a network namespace with one interface (``eth0``, a veth pair whose
other end sits on a bridge in a namespace of its own) and one address in 198.18.0.0/15, the block
reserved for network tests: nothing routes there, and the namespaces have no other interface, so
their traffic cannot leave them. Each host has its own loopback, folder and environment. The
namespaces share the filesystem and the process table with this one (that is what a namespace of
the network only is): the tests give each host its own folder and never hand one host's files to
another's processes, except what an operator provisions (a trust key, a token).

A cut between two hosts is a blackhole route to the other's address in each of the two: packets
between them vanish (a connection in progress hangs until its timeout; a new one fails at once),
while both still reach every other host. A whole-host cut takes the host's link down.

Names carry the owner's pid (``rg<pid>-<host>``): a run killed hard leaves namespaces whose owner is
gone, and the next run's :func:`sweep_stale` ends their processes and deletes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from revgate.flows.processes import Placement

# `users` sends the users' traffic and watches the route where a test cuts `control` from everything.
HOST_NAMES = ("control", "prefect", "ledger", "store", "gpu-1", "gpu-2", "edge-1", "edge-2", "users")
SUBNET = "198.18.0"  # a /24 inside 198.18.0.0/15 (RFC 2544: network tests), on the veths only
NETNS_DIR = Path("/run/netns")
OWNED = re.compile(r"^rg(?P<pid>\d+)-")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made here; the message says what is missing and how to get it."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ip ARGS``; with ``check``, a failure raises with what ip said."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


def namespaces() -> list[str]:
    """Every named network namespace on this machine."""
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]


def pids_in(netns: str) -> list[int]:
    """The processes inside a namespace now (``ip netns pids``)."""
    result = ip("netns", "pids", netns, check=False)
    return [int(pid) for pid in result.stdout.split()] if result.returncode == 0 else []


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def end_processes(netns: str, grace_s: float = 10.0) -> list[int]:
    """SIGTERM every process in ``netns``, SIGKILL those left after ``grace_s``; the pids that were there."""
    found = pids_in(netns)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids_in(netns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + grace_s
        while pids_in(netns) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pids_in(netns):
            break
    return found


def delete_namespace(netns: str, grace_s: float = 10.0) -> None:
    """End what runs inside ``netns``, then delete it (a process left inside would keep it alive)."""
    end_processes(netns, grace_s)
    ip("netns", "del", netns, check=False)


def owner_alive(netns: str) -> bool:
    """Whether the process that made ``netns`` (its pid is in the name) still runs."""
    match = OWNED.match(netns)
    return bool(match) and Path(f"/proc/{match['pid']}").exists()


def sweep_stale(own_prefix: str = "") -> list[str]:
    """Delete the ``rg<pid>-`` namespaces whose owner is gone, and (before this run makes any) those with
    this run's own prefix, left by an earlier owner with the same pid; the names deleted."""
    stale = [name for name in namespaces()
             if OWNED.match(name) and ((own_prefix and name.startswith(own_prefix)) or not owner_alive(name))]
    for name in stale:
        delete_namespace(name)
    return stale


@dataclass(frozen=True)
class Host:
    """One host: a network namespace with one address, its own folder and its own environment."""

    name: str
    netns: str
    address: str
    folder: Path
    env: Mapping[str, str]

    @property
    def launcher(self) -> tuple[str, ...]:
        """The command prefix that runs a command on this host."""
        return ("ip", "netns", "exec", self.netns)

    def placement(self, **env: str) -> Placement:
        """Where a service started by ``revgate.flows.processes`` runs on this host, with ``env`` added."""
        return Placement(launcher=self.launcher, host=self.address, environ={**self.env, **env}, cwd=self.folder)

    def url(self, port: int) -> str:
        """``http://ADDRESS:PORT`` on this host."""
        return f"http://{self.address}:{port}"

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` on this host (in its folder, with its environment plus ``env``)."""
        kw.setdefault("cwd", self.folder)
        return subprocess.Popen([*self.launcher, *argv], env={**self.env, **(env or {})}, **kw)

    def run(self, argv: Sequence[str], *, timeout: float = 60, env: Mapping[str, str] | None = None,
            **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this host to its end; its exit code and output (text)."""
        kw.setdefault("cwd", self.folder)
        return subprocess.run([*self.launcher, *argv], env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout, check=False, **kw)

    @contextlib.contextmanager
    def network(self) -> Iterator[Host]:
        """For the block, the calling thread (and the threads it starts) is on this host's network:
        a socket it opens is this host's. Processes it starts are too, but use :meth:`popen` for them."""
        back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(NETNS_DIR / self.netns, os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield self
            finally:
                _setns(back)
        finally:
            os.close(target)
            os.close(back)

    def cut_from(self, other: Host) -> None:
        """A partition between this host and ``other`` only: each drops what it sends to the other."""
        ip("-n", self.netns, "route", "replace", "blackhole", f"{other.address}/32")
        ip("-n", other.netns, "route", "replace", "blackhole", f"{self.address}/32")

    def cut(self) -> None:
        """A whole-host cut: this host's link goes down; it reaches no one and no one reaches it."""
        ip("-n", self.netns, "link", "set", "eth0", "down")

    def heal(self, other: Host | None = None) -> None:
        """End the cut from ``other`` (with no ``other``: the whole-host cut)."""
        if other is None:
            ip("-n", self.netns, "link", "set", "eth0", "up")
            return
        ip("-n", self.netns, "route", "del", "blackhole", f"{other.address}/32", check=False)
        ip("-n", other.netns, "route", "del", "blackhole", f"{self.address}/32", check=False)

    def free_port(self) -> int:
        """A port free on this host's address now."""
        with self.network(), socket.socket() as probe:
            probe.bind((self.address, 0))
            return int(probe.getsockname()[1])

    def pids(self) -> list[int]:
        """The processes running on this host now."""
        return pids_in(self.netns)


def base_env(folder: Path) -> dict[str, str]:
    """A host's own environment: its folder as home and temporary space, offline model hub, no telemetry.
    Nothing of the test process's environment but PATH (the same software is installed on every host)."""
    (folder / "tmp").mkdir(parents=True, exist_ok=True)
    # The test run's mark (tests/conftest.py) travels, so what a host's processes leave is seen at the end.
    mark = {name: os.environ[name] for name in ("REVGATE_TEST_RUN",) if name in os.environ}
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(folder), "TMPDIR": str(folder / "tmp"),
            "LANG": "C.UTF-8", "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1", **mark}


def why_unavailable() -> str:
    """What keeps network namespaces from being made here (empty: nothing known)."""
    if shutil.which("ip") is None:
        return ("no `ip` command: install iproute2 (apt-get install iproute2; .ci/setup installs it where `ip` "
                "is missing)")
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN): run the tests as root, as CI does"
    return ""


@dataclass
class Network:
    """Hosts on one bridge; :meth:`close` ends every process on them and deletes them."""

    prefix: str
    hosts: dict[str, Host] = field(default_factory=dict)

    @property
    def bridge(self) -> str:
        """The bridge's own namespace."""
        return f"{self.prefix}br"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    @classmethod
    def create(cls, prefix: str, names: Sequence[str], root: Path) -> Network:
        """``names`` as hosts 198.18.0.1, .2, ... on one bridge; HostsUnavailable where namespaces cannot be made."""
        missing = why_unavailable()
        if missing:
            raise HostsUnavailable(missing)
        network = cls(prefix)
        try:
            made = ip("netns", "add", network.bridge, check=False)
            if made.returncode != 0:
                raise HostsUnavailable(f"cannot make a network namespace (ip netns add: {made.stderr.strip()}); "
                                       "run as root on a kernel with network namespaces")
            ip("-n", network.bridge, "link", "add", "br0", "type", "bridge")
            ip("-n", network.bridge, "link", "set", "br0", "up")
            for number, name in enumerate(names, start=1):
                network.hosts[name] = network._add(name, f"{SUBNET}.{number}", root / name)
        except BaseException:
            network.close()
            raise
        return network

    def _add(self, name: str, address: str, folder: Path) -> Host:
        netns, peer = f"{self.prefix}{name}", f"h-{name}"[:15]  # interface names: 15 characters at most
        ip("netns", "add", netns)
        # Both ends are made inside namespaces of this run: nothing appears on this machine's own network.
        ip("-n", self.bridge, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("-n", self.bridge, "link", "set", peer, "master", "br0", "up")
        ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", netns, "link", "set", "lo", "up")
        ip("-n", netns, "link", "set", "eth0", "up")
        folder.mkdir(parents=True, exist_ok=True)
        return Host(name, netns, address, folder, MappingProxyType(base_env(folder)))

    def leftovers(self) -> dict[str, list[int]]:
        """Processes still running on each host (none once every test has stopped what it started)."""
        return {name: pids for name, host in self.hosts.items() if (pids := host.pids())}

    def close(self, grace_s: float = 10.0) -> None:
        """End every process still inside each namespace (SIGKILL after ``grace_s``), then delete the
        namespaces and the bridge."""
        for host in self.hosts.values():
            delete_namespace(host.netns, grace_s)
        if self.bridge in namespaces():
            delete_namespace(self.bridge, grace_s)
        self.hosts.clear()


def run_prefix(pid: int | None = None) -> str:
    """This run's namespace prefix: ``rg<pid>-``."""
    return f"rg{os.getpid() if pid is None else pid}-"


def pid_gone(pid: int) -> bool:
    """Whether no process has ``pid`` (a zombie counts as gone: it runs nothing)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status
