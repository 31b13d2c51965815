"""The worker agent: owns the replicas on this host, from verified load to drained stop.

One asyncio loop. Blocking steps (fetch, hashing, starting and stopping vLLM) run in threads;
the control API and the per-replica proxies run on the loop. A replica value is replaced on
every change (see :mod:`serving.worker.state`), so readers always see a consistent snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from revgate.manifests.errors import RevgateError
from revgate.registry.compat import CPU_ENGINE, GPU_ENGINE
from revgate.registry.runtime import engine_runtime
from revgate.serving.worker.artifact import ArtifactPreparer, SealedArtifact
from revgate.serving.worker.cores import DEFAULT_TURN_EVERY_S, bind_mask, least_used, next_turn, split_cores
from revgate.serving.worker.drain import Admission
from revgate.serving.worker.engine import (
    ENGINE_HOST,
    KILL_WAIT_S,
    PORT_RELEASE_S,
    Device,
    EngineError,
    EngineProcess,
    engine_command,
    engine_env,
    free_port,
    health_status,
    move_session_threads,
    port_is_open,
    session_members,
)
from revgate.serving.worker.engine import engine_python as default_engine_python
from revgate.serving.worker.kept import KeptReplica, read_kept, write_kept
from revgate.serving.worker.proxy import ReplicaProxy
from revgate.serving.worker.report import engine_report
from revgate.serving.worker.request import ReplicaRequest
from revgate.serving.worker.sealed import recheck, remove_tree
from revgate.serving.worker.state import DrainReport, Failure, Replica, ReplicaState
from revgate.serving.worker.warm import vocab_size, warm_up

LOG = logging.getLogger("revgate.worker")
LOG_TAIL_LINES = 20
SUPERVISE_EVERY_S = 0.25
DEFAULT_STOP_TIMEOUT_S = 15.0
# Replicas of a digest in these states are still verifying or loading its files.
VERIFYING = (ReplicaState.CREATED, ReplicaState.LOADING)


class Preparer(Protocol):
    """Fetch and verify a request's artifact into a replica's own folder (see ArtifactPreparer)."""

    def __call__(self, request: ReplicaRequest, cache: Path, into: Path | None = None) -> SealedArtifact:
        """The verified, read-only folder to load."""


class UnknownReplica(RevgateError):
    """No replica with this id is known to this worker."""


class SignaturePolicyConflict(RevgateError):
    """A start asks for an artifact that a loading replica verifies under another signature policy."""


class SupervisedEngine(EngineProcess):
    """An engine process whose exit can be polled without blocking (for supervision)."""

    def exit_code(self) -> int | None:
        """The exit status once the process has ended, else None."""
        return None if self._process is None else self._process.poll()


class AdoptedEngine(SupervisedEngine):
    """An engine an earlier agent on this cache left running: known by its session (its pid) and port.

    Not this agent's child, so its exit status is unknown: ``exit_code`` is -1 once it has gone."""

    def __init__(self, pid: int, port: int, log_path: Path) -> None:
        super().__init__([], {}, port, ENGINE_HOST, log_path, outlive_parent=True)
        self._adopted_pid = pid

    @property
    def pid(self) -> int | None:
        """The engine's pid (its session's leader)."""
        return self._adopted_pid

    def exit_code(self) -> int | None:
        """-1 once every process of its session has gone, else None."""
        return -1 if not session_members(self._adopted_pid) else None

    def start(self) -> None:
        raise EngineError("an adopted engine is already running", fix="Start a new replica instead.")

    def stop(self, grace: float = 15.0) -> bool:
        """SIGTERM its whole session, SIGKILL what is left after ``grace``; whether SIGKILL was needed."""
        killed = self._stop_leftovers(self._adopted_pid, grace)
        self._wait_port_released()
        return killed


def served_model_name(request: ReplicaRequest) -> str:
    """The served model name carries the revision fingerprint, so a router can check what it talks to."""
    name = request.revision.name or "revision"
    return f"{name}@{request.revision.short}"


def log_tail(path: Path, count: int = LOG_TAIL_LINES) -> tuple[str, ...]:
    """The last ``count`` lines of a replica's engine log."""
    try:
        return tuple(path.read_text(errors="replace").splitlines()[-count:])
    except OSError:
        return ()


def failure_of(error: BaseException) -> Failure:
    """A failure record from an exception, keeping the typed error's name."""
    return Failure(error=type(error).__name__, message=str(error))


def process_gone(pid: int | None) -> bool:
    """Whether the process no longer exists (its memory is released)."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A reaped child disappears; a zombie still answers kill(0), so look at its state.
    status = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return status.read_text().split(") ")[-1].startswith("Z")
    return True


def _discard(done: asyncio.Future[SealedArtifact], folder: Path) -> None:
    """A preparation nobody waits for any more: its outcome is dropped and its folder removed."""
    if not done.cancelled():
        done.exception()  # retrieved, so asyncio does not log it as lost
    remove_tree(folder)


@dataclass(frozen=True, slots=True)
class _Stopped:
    """How an engine stop ended: port free, exit status, whether SIGKILL was needed, and why if not clean."""

    port_released: bool = True
    exit_code: int | None = None
    killed: bool = False
    reason: str = ""


@dataclass
class _Running:
    """The live parts of one replica: its engine, proxy, admission gate and background tasks."""

    request: ReplicaRequest
    admission: Admission
    log_path: Path
    folder: Path  # the replica's own hard links to the verified files: what its engine loads
    slot: int | None = None  # the CPU slot its engine computes on (None: no slots, or not started)
    engine: SupervisedEngine | None = None
    proxy: ReplicaProxy | None = None
    stopping: bool = False
    vocab: int = 256
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class WorkerAgent:
    """Starts, supervises, drains and reports the replicas of this host."""

    def __init__(
        self,
        cache: Path,
        *,
        device: Device = "cpu",
        engine_python: Path | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 300.0,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        preparer: Preparer | None = None,
        cpu_slots: int = 2,
        keep_replicas: bool = False,
        turn_every_s: float = DEFAULT_TURN_EVERY_S,
    ) -> None:
        self.cache = cache
        # Ready replicas on slots of one size take turns on them (see serving.worker.cores); 0: never.
        self.turn_every_s = turn_every_s
        self._turns: asyncio.Task[None] | None = None
        # Ready replicas outlive this agent (their engines run on when it stops) for the next one to adopt.
        self.keep_replicas = keep_replicas
        # On the CPU each replica computes on its own slot of this process's cores (see serving.worker.cores).
        self.slots = split_cores(sorted(os.sched_getaffinity(0)), cpu_slots) if device == "cpu" else ()
        self.device = device
        self.engine_python = engine_python
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        python = engine_python or default_engine_python()
        # The engine environment is <venv>/bin/python; its lock names the runtime this host offers.
        self.engine_venv = python.parent.parent
        self.preparer = preparer or ArtifactPreparer(engine_venv=self.engine_venv, device=device)
        self._replicas: dict[str, Replica] = {}
        self._running: dict[str, _Running] = {}
        self._ids = itertools.count(1)
        (cache / "logs").mkdir(parents=True, exist_ok=True)
        # What an earlier agent on this cache left running is adopted or stopped by :meth:`take_over`; the
        # replica folders of anything else it had are stale.
        self._left = read_kept(cache)
        self.took_over: dict[str, str] = {}  # replica id -> "adopted" or why it was stopped
        kept = {entry.replica_id for entry in self._left}
        for folder in (cache / "replicas").glob("*") if (cache / "replicas").is_dir() else ():
            if folder.name not in kept:
                remove_tree(folder)

    # ----- what an earlier agent left

    async def take_over(self) -> dict[str, str]:
        """Adopt (with ``keep_replicas``) or stop each replica the last agent on this cache left running, and
        say which: replica id -> "adopted", or why it was stopped. Runs once, before the control API serves."""
        left, self._left = self._left, []
        for entry in left:
            try:
                self.took_over[entry.replica_id] = await self._take_over(entry)
            except Exception as error:  # one replica that cannot be taken over never keeps the agent down
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(AdoptedEngine(entry.engine_pid, entry.engine_port, Path(
                        self.cache / "logs" / f"{entry.replica_id}.log")).stop, self.stop_timeout_s)
                self._running.pop(entry.replica_id, None)
                self._replicas.pop(entry.replica_id, None)
                self.took_over[entry.replica_id] = f"stopped: it could not be adopted ({type(error).__name__}: {error})"
            LOG.info("replica %s (%s) left by the last agent on this cache: %s", entry.replica_id,
                     entry.served_model, self.took_over[entry.replica_id])
        numbers = [int(name.rsplit("-", 1)[1]) for name in self.took_over if name.rsplit("-", 1)[-1].isdigit()]
        self._ids = itertools.count(max([0, *numbers]) + 1)  # a new replica never reuses an adopted id
        self._record_kept()
        return dict(self.took_over)

    async def _take_over(self, entry: KeptReplica) -> str:
        engine = AdoptedEngine(entry.engine_pid, entry.engine_port, self.cache / "logs" / f"{entry.replica_id}.log")
        if engine.exit_code() is not None:
            return "gone: its engine is no longer running"
        answering = await asyncio.to_thread(health_status, ENGINE_HOST, entry.engine_port) == 200
        if not (self.keep_replicas and answering):
            why = "this agent does not keep replicas" if answering else "its engine does not answer /health"
            await asyncio.to_thread(engine.stop, self.stop_timeout_s)
            remove_tree(self.cache / "replicas" / entry.replica_id)
            return f"stopped: {why}"
        running = _Running(entry.replica_request(), Admission(entry.replica_id), engine.log_path,
                           self.cache / "replicas" / entry.replica_id, slot=entry.slot, engine=engine)
        running.proxy = ReplicaProxy(running.admission, entry.revision, entry.engine_port, self.host)
        try:
            await running.proxy.start(entry.proxy_port)
        except OSError as error:  # its endpoint is taken: a replica nobody can reach is no replica
            await asyncio.to_thread(engine.stop, self.stop_timeout_s)
            remove_tree(running.folder)
            return f"stopped: its endpoint's port {entry.proxy_port} cannot be listened on ({error})"
        self._running[entry.replica_id] = running
        self._replicas[entry.replica_id] = Replica(
            replica_id=entry.replica_id, revision=entry.revision, served_model=entry.served_model,
            state=ReplicaState.READY, endpoint=f"http://{self.host}:{entry.proxy_port}", created_at=entry.created_at,
            engine_port=entry.engine_port, pid=entry.engine_pid, cpu_cores=entry.cpu_cores,
            timings_s=entry.timings_s, capacity=entry.measured(), adopted=True)
        running.admission.open()
        running.tasks.append(asyncio.get_running_loop().create_task(self._supervise(entry.replica_id)))
        return "adopted"

    def _record_kept(self) -> None:
        """The ready replicas, as the next agent on this cache reads them (see serving.worker.kept)."""
        kept = []
        for replica_id, running in self._running.items():
            replica = self._replicas[replica_id]
            if not replica.is_ready or running.engine is None or running.engine.pid is None or running.proxy is None:
                continue
            kept.append(KeptReplica(
                replica_id=replica_id, revision=replica.revision, served_model=replica.served_model,
                request=running.request.model_dump(mode="json"), engine_pid=running.engine.pid,
                engine_port=running.engine.port, proxy_port=running.proxy.port, cpu_cores=replica.cpu_cores,
                slot=running.slot, created_at=replica.created_at, timings_s=dict(replica.timings_s),
                capacity=None if replica.capacity is None else {
                    "requests_per_s": replica.capacity.requests_per_s,
                    "output_tokens_per_s": replica.capacity.output_tokens_per_s,
                    "concurrency": replica.capacity.concurrency}))
        write_kept(self.cache, kept)

    async def _leave(self, replica_id: str, running: _Running) -> None:
        """Agent shutdown with ``keep_replicas``: stop serving the replica's endpoint here; its engine runs on."""
        running.stopping = True  # supervision ends with this agent, not the engine
        for task in running.tasks:
            task.cancel()
        if running.proxy is not None:
            await running.proxy.close()
        LOG.info("replica %s (%s) left running for the next agent on this cache", replica_id,
                 self._replicas[replica_id].served_model)

    # ----- reading

    def engine_report(self) -> dict[str, Any]:
        """This host's engine build and capabilities (``GET /v1/engine``): what a revision started here runs on."""
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        engine = CPU_ENGINE if self.device == "cpu" else GPU_ENGINE
        return engine_report(engine_runtime(self.engine_venv), engine, device=self.device,
                             slots=len(self.slots), memory_bytes=memory)

    def replicas(self) -> list[Replica]:
        """A snapshot of every replica this agent has had, in start order."""
        return list(self._replicas.values())

    def replica(self, replica_id: str) -> Replica:
        """One replica's current state, or :class:`UnknownReplica`."""
        try:
            return self._replicas[replica_id]
        except KeyError:
            raise UnknownReplica(
                f"no replica {replica_id!r} on this worker", fix="List replicas with GET /v1/replicas."
            ) from None

    def probes(self, replica_id: str) -> dict[str, bool]:
        """Startup (the engine answered /health once), liveness (its process runs now) and readiness
        (warm-up passed, not draining): three separate signals, so slow loading is not death.
        """
        replica = self.replica(replica_id)
        running = self._running.get(replica_id)
        alive = running is not None and running.engine is not None and running.engine.exit_code() is None
        return {"startup": "engine_start_s" in replica.timings_s, "liveness": alive, "readiness": replica.is_ready}

    def in_flight(self, replica_id: str) -> int:
        """Requests admitted by the replica's proxy and not yet finished."""
        running = self._running.get(replica_id)
        return 0 if running is None else running.admission.in_flight

    # ----- lifecycle

    def start(self, request: ReplicaRequest) -> Replica:
        """Create a replica (state ``created``) and bring it up in the background; returns at once.

        Every start is a new identity: a failed or drained replica is never restarted under its id.
        A start whose signature policy differs from that of a replica still verifying or loading
        the same artifact is refused (:class:`SignaturePolicyConflict`) and changes nothing.
        """
        self._check_policy(request)
        replica_id = f"{request.revision.short}-{next(self._ids)}"
        replica = Replica(replica_id=replica_id, revision=request.revision.fingerprint,
                          served_model=served_model_name(request), created_at=time.time())
        self._replicas[replica_id] = replica
        running = _Running(request, Admission(replica_id), self.cache / "logs" / f"{replica_id}.log",
                           self.cache / "replicas" / replica_id)
        self._running[replica_id] = running
        running.tasks.append(asyncio.get_running_loop().create_task(self._bring_up(replica_id)))
        return replica

    def _check_policy(self, request: ReplicaRequest) -> None:
        for replica_id, running in self._running.items():
            if (self._replicas[replica_id].state in VERIFYING
                    and running.request.manifest_digest == request.manifest_digest
                    and running.request.signature_policy != request.signature_policy):
                raise SignaturePolicyConflict(
                    f"replica {replica_id} is loading artifact {request.manifest_digest} under another "
                    "signature policy; nothing was started",
                    where="ReplicaRequest.signature_policy",
                    fix="Start it with the same signature policy, or once that replica is ready or gone.",
                )

    def _set(self, replica: Replica) -> Replica:
        previous = self._replicas.get(replica.replica_id)
        self._replicas[replica.replica_id] = replica
        if previous is None or previous.state is not replica.state:
            reason = f": {replica.failure.message.splitlines()[0]}" if replica.failure else ""
            LOG.info("replica %s (%s) is %s%s", replica.replica_id, replica.served_model, replica.state, reason)
        return replica

    def _timed(self, replica_id: str, **timings: float) -> None:
        replica = self._replicas[replica_id]
        self._set(replace(replica, timings_s={**replica.timings_s, **timings}))

    async def _bring_up(self, replica_id: str) -> None:
        running = self._running[replica_id]
        try:
            await self._load(replica_id, running)
            await self._warm(replica_id, running)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # every failure, typed or not, is reported on the replica
            await self._fail(replica_id, failure_of(error))

    async def _load(self, replica_id: str, running: _Running) -> None:
        started = time.monotonic()
        self._set(self._replicas[replica_id].moved_to(ReplicaState.LOADING))
        prepared = await self._prepare(running)
        self._timed(replica_id, fetch_s=prepared.fetch_s, verify_s=prepared.verify_s)
        if running.stopping:
            return
        running.slot = least_used(self.slots, self._slots_in_use())
        cores = self.slots[running.slot] if running.slot is not None else ()
        engine = self.engine_for(running.request, prepared.served, running.log_path, cores=cores)
        running.engine = engine
        engine_started = time.monotonic()
        # On the loop, not in a thread: a drain can then never miss a process started behind its back.
        engine.start()
        self._set(replace(self._replicas[replica_id], engine_port=engine.port, pid=engine.pid, cpu_cores=cores))
        running.tasks.append(asyncio.get_running_loop().create_task(self._supervise(replica_id)))
        await asyncio.to_thread(engine.wait_healthy, self.startup_timeout_s)
        self._timed(replica_id, engine_start_s=time.monotonic() - engine_started, load_s=time.monotonic() - started)
        # vLLM has read its files now: what it read is what was verified unless they moved since.
        await asyncio.to_thread(recheck, prepared.model_dir, prepared.stamps)
        running.vocab = vocab_size(prepared.served)

    async def _prepare(self, running: _Running) -> SealedArtifact:
        """Verify into the replica's folder; a drain that cancels the wait still gets the folder removed."""
        folder = running.folder
        work = asyncio.ensure_future(asyncio.to_thread(self.preparer, running.request, self.cache, folder))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            work.add_done_callback(lambda done: _discard(done, folder))
            raise

    def begin_turns(self) -> None:
        """Start the ready replicas' turns on the CPU slots, every ``turn_every_s`` until :meth:`close`."""
        if self._turns is None and self.turn_every_s > 0 and len(self.slots) > 1:
            self._turns = asyncio.get_running_loop().create_task(self._take_turns())

    async def _take_turns(self) -> None:
        while True:
            await asyncio.sleep(self.turn_every_s)
            try:
                await self.take_turn()
            except Exception:  # a turn that failed leaves the replicas where they were; the next one tries again
                LOG.exception("the replicas' turn on the CPU slots failed")

    async def take_turn(self) -> dict[str, tuple[int, ...]]:
        """One turn: each ready replica moves to the next slot of its size (serving.worker.cores.next_turn).

        None moves while a replica with a started engine is not ready: a loading engine binds to the
        cores it was started with, and a draining one is about to free its own. The replicas moved, by id,
        with their new cores.
        """
        engines = {rid: running for rid, running in self._running.items()
                   if running.engine is not None and running.slot is not None and not running.stopping}
        if len(engines) < 2 or not all(self._replicas[rid].is_ready for rid in engines):
            return {}
        held = {rid: running.slot for rid, running in engines.items() if running.slot is not None}
        moves = {rid: slot for rid, slot in next_turn(held, self.slots).items() if slot != held[rid]}
        if not moves:
            return {}
        planned = {rid: (engines[rid], held[rid], slot) for rid, slot in moves.items()}
        await asyncio.to_thread(self._move_threads, planned)
        for rid, slot in moves.items():  # in one step on the loop: a reader never sees half a turn
            engines[rid].slot = slot
            self._set(replace(self._replicas[rid], cpu_cores=self.slots[slot]))
        self._record_kept()
        return {rid: self.slots[slot] for rid, slot in moves.items()}

    def _move_threads(self, moves: Mapping[str, tuple[_Running, int, int]]) -> None:
        for running, old, new in moves.values():
            if running.engine is not None and running.engine.pid is not None:
                move_session_threads(running.engine.pid, self.slots[old], self.slots[new])

    def _slots_in_use(self) -> dict[int, int]:
        """Replicas with a started engine, by CPU slot."""
        used: dict[int, int] = {}
        for running in self._running.values():
            if running.slot is not None and running.engine is not None:
                used[running.slot] = used.get(running.slot, 0) + 1
        return used

    def engine_for(self, request: ReplicaRequest, model_dir: Path, log_path: Path, *,
                   cores: tuple[int, ...] = ()) -> SupervisedEngine:
        """The (unstarted) engine for a verified model (its folder, or a single-file artifact's one
        file): this host's device, a free loopback port (never the worker's address), the revision's
        execution config, the fingerprint in the served model name, and on the CPU its slot's cores.
        """
        execution = request.revision.execution
        port = free_port(ENGINE_HOST)
        command = engine_command(
            model_dir, execution, port, served_model_name(request), device=self.device, python=self.engine_python,
        )
        env = engine_env(execution, self.device)
        if cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind_mask(cores)
        return SupervisedEngine(command, env, port, ENGINE_HOST, log_path, outlive_parent=self.keep_replicas,
                                cores=cores)

    async def _warm(self, replica_id: str, running: _Running) -> None:
        if running.stopping or running.engine is None:
            return
        self._set(self._replicas[replica_id].moved_to(ReplicaState.WARMING))
        started = time.monotonic()
        replica = self._replicas[replica_id]
        capacity = await warm_up(
            running.engine.port, replica.served_model, running.request.warm,
            running.vocab, replica_id,
        )
        running.proxy = ReplicaProxy(running.admission, replica.revision, running.engine.port, self.host)
        proxy_port = await running.proxy.start()
        if running.stopping:
            return
        self._timed(replica_id, warm_s=time.monotonic() - started)
        # Readiness is published in one step: the state and the gate change together.
        running.admission.open()
        self._set(self._replicas[replica_id].moved_to(
            ReplicaState.READY, capacity=capacity, endpoint=f"http://{self.host}:{proxy_port}"
        ))
        self._record_kept()

    async def _supervise(self, replica_id: str) -> None:
        """Notice a dead engine: report state, exit code and log tail; never restart it under this id."""
        running = self._running[replica_id]
        while running.engine is not None and not running.stopping:
            code = running.engine.exit_code()
            if code is not None:
                failure = Failure(
                    error="ReplicaDied",
                    message=f"the engine process {running.engine.pid} exited with status {code}",
                    exit_code=code,
                    log_tail=log_tail(running.log_path),
                )
                await self._fail(replica_id, failure)
                return
            await asyncio.sleep(SUPERVISE_EVERY_S)

    async def _fail(self, replica_id: str, failure: Failure) -> None:
        replica = self._replicas[replica_id]
        if replica.state in (ReplicaState.FAILED, ReplicaState.TERMINATED):
            return
        running = self._running[replica_id]
        running.stopping = True
        running.admission.close(f"replica {replica_id} failed: {failure.message.splitlines()[0]}")
        self._set(replica.failed(failure))
        self._record_kept()
        await self._release(running)

    async def _release(self, running: _Running) -> _Stopped:
        """Stop the proxy and the engine (SIGKILL after the stop timeout), remove the replica's folder.

        Bounded whatever the engine does: a process that outlives even SIGKILL is reported, not awaited.
        """
        if running.proxy is not None:
            await running.proxy.close()
        engine = running.engine
        stopped = _Stopped()
        if engine is not None:
            stopped = await self._stop_engine(engine)
        running.slot = None  # its cores are free for the next replica
        await asyncio.to_thread(remove_tree, running.folder)
        return stopped

    async def _stop_engine(self, engine: SupervisedEngine) -> _Stopped:
        timeout = self.stop_timeout_s
        reason = ""
        killed = False
        try:
            stop = asyncio.to_thread(engine.stop, timeout)
            killed = await asyncio.wait_for(stop, timeout + KILL_WAIT_S + PORT_RELEASE_S)
        except (EngineError, TimeoutError) as error:
            reason = str(error) or f"the engine process {engine.pid} did not end within the stop deadline"
        if killed:
            reason = f"the engine did not exit within {timeout:g} s of SIGTERM and was killed (SIGKILL)"
        return _Stopped(not port_is_open(engine.port, ENGINE_HOST), engine.exit_code(), killed, reason)

    def withdraw(self, replica_id: str) -> Replica:
        """First step of a drain, synchronous: readiness withdrawn and new requests refused at once."""
        replica = self.replica(replica_id)
        running = self._running[replica_id]
        drained = self._set(replica.moved_to(ReplicaState.DRAINING))  # IllegalTransition names the allowed states
        self._record_kept()
        running.stopping = True
        running.admission.close(f"replica {replica_id} is draining; retry on another replica")
        return drained

    async def drain(self, replica_id: str, grace_s: float) -> Replica:
        """Withdraw readiness, refuse new requests, wait up to ``grace_s`` for in-flight ones,
        cancel the rest with a stated reason, stop the engine, and confirm port and memory release.
        """
        if self.replica(replica_id).state is not ReplicaState.DRAINING:
            self.withdraw(replica_id)
        running = self._running[replica_id]
        outcome = await running.admission.drain(grace_s, f"replica {replica_id} is draining; retry on another replica")
        for task in running.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        stopped = await self._release(running)
        engine_pid = running.engine.pid if running.engine is not None else None
        report = DrainReport(
            grace_s=grace_s, completed=outcome.completed, cancelled=outcome.cancelled,
            cancel_reason=outcome.cancel_reason,
            port_released=stopped.port_released,
            memory_released=process_gone(engine_pid),
            process_exit_code=stopped.exit_code,
            killed=stopped.killed,
            stop_reason=stopped.reason,
        )
        return self._set(self._replicas[replica_id].moved_to(ReplicaState.TERMINATED, drain=report))

    def begin_drain(self, replica_id: str, grace_s: float) -> Replica:
        """Withdraw at once and finish the drain in the background; returns the ``draining`` replica."""
        drained = self.withdraw(replica_id)
        loop = asyncio.get_running_loop()
        self._running[replica_id].tasks.append(loop.create_task(self._drain_task(replica_id, grace_s)))
        return drained

    async def _drain_task(self, replica_id: str, grace_s: float) -> None:
        try:
            await self.drain(replica_id, grace_s)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # whatever went wrong, the replica ends; it is never left draining
            await self._fail(replica_id, failure_of(error))

    async def close(self, grace_s: float = 5.0) -> None:
        """Drain every live replica (on agent shutdown nothing is left running), except, with
        ``keep_replicas``, the ready ones: their engines run on, recorded for the next agent to adopt."""
        if self._turns is not None:
            self._turns.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._turns
            self._turns = None
        live = [r.replica_id for r in self.replicas() if r.state not in (ReplicaState.FAILED, ReplicaState.TERMINATED)]
        for replica_id in live:
            running = self._running[replica_id]
            if self.keep_replicas and self._replicas[replica_id].is_ready:
                await self._leave(replica_id, running)
                continue
            running.stopping = True
            if self._replicas[replica_id].state is ReplicaState.CREATED:
                self._set(self._replicas[replica_id].moved_to(ReplicaState.TERMINATED))
                continue
            with contextlib.suppress(RevgateError):
                await self.drain(replica_id, grace_s)
