"""The embedded default end to end: a full promotion on one machine.

Builds (or reuses) the reference zoo, signs and publishes two revisions, starts a Prefect server,
a worker agent running vLLM on the CPU and a router, puts the stable revision on a route, then
runs ``promote_revision`` for the candidate through shadow and canary stages to a decision.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from revgate.evaluation.traces import generate_trace, write_trace
from revgate.flows import processes
from revgate.flows.spec import PromotionSpec
from revgate.flows.steps import start_replica
from revgate.manifests.gates import GatePolicy
from revgate.manifests.revision import ExecutionConfig, InterfacePolicy, ServiceRevision
from revgate.manifests.rollout import Analyze, Approve, RolloutPlan, SetWeight, Shadow
from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import serving_limits, successor
from revgate.manifests.worker import WarmProfile
from revgate.registry.build import build_manifest
from revgate.registry.record_signing import new_key_pair
from revgate.registry.route_store import open_route_store
from revgate.registry.runtime import engine_runtime
from revgate.registry.signing import sign_with_key
from revgate.registry.store import open_store
from revgate.serving.router.admin_client import RouterAdmin
from revgate.serving.token_file import credential_digest, write_token
from revgate.serving.worker.client import WorkerClient
from revgate.serving.worker.request import ReplicaRequest, SignaturePolicySpec
from revgate.serving.worker.views import ReplicaView

ROUTE = "demo"
DEMO_ROUTER = "demo-router"  # the router's id in the record sink; the route's one record signer
EXECUTION = ExecutionConfig(dtype="float32", max_model_len=64, kv_cache_bytes=64 * 2**20, enforce_eager=True)

# Candidates that behave exactly like stable (A/A checks): only the revision's identity differs, so
# any decision against one of them is a false alarm of the gates.
STABLE_COPY, STABLE_RECONFIGURED = "stable-copy", "stable-reconfigured"
AA_CANDIDATES = (STABLE_COPY, STABLE_RECONFIGURED)
# A larger KV cache only changes how many sequences fit at once; dtype and max_model_len, which decide
# the greedy answers, stay stable's.
RECONFIGURED = EXECUTION.model_copy(update={"kv_cache_bytes": 96 * 2**20})
COPY_NOTE = (
    "An identical copy of the reference zoo's stable revision, for A/A checks: the same weights, tokenizer and "
    "chat template, published as a new artifact. This note is its only difference; no engine reads it.\n"
)


def signing_key(folder: Path, name: str = "publisher") -> tuple[Path, Path]:
    """A P-256 key pair for the demo's publisher, or its controller (``name``), made once."""
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    if not private.exists():
        folder.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        private.chmod(0o600)
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def router_key(folder: Path, router_id: str) -> tuple[Path, dict[str, str]]:
    """The demo router's record-signing key (made once), and the route's record signers naming its public half."""
    private, public = folder / "router.key", folder / "router.pub"
    if not private.exists():
        folder.mkdir(parents=True, exist_ok=True)
        public.write_bytes(new_key_pair(private).public_pem())
    return private, {router_id: str(public)}


def publish(model_dir: Path, store: str, key: Path, folder: Path) -> str:
    """Build the manifest, sign it, push folder and signature; the pinned manifest digest."""
    manifest = build_manifest(model_dir)
    signature = folder / f"{manifest.digest[7:19]}.sig"
    folder.mkdir(parents=True, exist_ok=True)
    sign_with_key(manifest, signature, key, model_name=model_dir.name)
    return open_store(store).push(model_dir, manifest, signature)


def demo_plan() -> RolloutPlan:
    """Shadow everything, approve, then a 50% canary: small enough for one CPU machine.

    The shadow stage sends enough probes for every task slice to reach the paired gates' horizon
    (1,200 mirrored, about 200 pairs per slice). The canary's 2,400 probes give each arm about 1,200
    samples, past the latency gates' horizon of 480. Before each stage the power check asks whether
    every two-sample gate would pass a revision equal to stable at least 9 times in 10, from stable's
    latency as the shadow stage measured it; a stage too short is extended up to 4,800 probes, and
    one that still cannot decide is refused with the reason.
    """
    return RolloutPlan(steps=(
        Shadow(sample_ppm=1_000_000), Analyze(max_samples=1200), Approve(),
        SetWeight(weight_ppm=500_000), Analyze(max_samples=2400, extend_to=4800),
    ), lease_seconds=600, rollback_window_seconds=5, power_target=Decimal("0.9"))


def demo_policy() -> GatePolicy:
    """Quality on pairs in shadow, per task slice; latency, errors and SLOs in the canary; sized for one machine.

    Quality is judged where it can be decided: in shadow both revisions answer the same prompts, so
    only prompts they answer differently carry evidence, and a revision that answers like stable
    passes every slice within the 8-point margin by 160 pairs (an identical one has no discordant
    pair at all), while `slice-regressed`'s 16-point drop on `sort/long` fails. In the canary each
    arm answers other prompts: a two-sample test of the hardest slice (`add/long`, stable 23%) needs
    about 785 samples per arm to pass an equal revision 9 times in 10 (the power check's figure);
    the demo's canary gives it about 200, so an equal revision came out inconclusive there and was
    rolled back. So the canary judges no quality (``two_sample_quality`` off).

    Latency is judged in the canary, where both revisions serve the same mix side by side: two-sample
    tests of log TTFT and log E2E that fail when the candidate is shown more than 1.25x slower and
    pass within 1.5x, looking every 120 samples per arm up to 480. Identical revisions measured up to
    1.18x apart with their cores swapped, so smaller shown slowdowns are not failed; `slow` measured
    1.97x stable's E2E. The canary counts only once both engines are idle (the shadow's last copies
    left a transient on the candidate: 27 ms median TTFT against stable's 6 ms over its first 5 s).
    Futility: a latency comparison that can no longer pass stops early. Not in shadow: there stable
    serves the probes and the users at once while the shadow answers the mirror's copies after
    stable's answers, so a pair's two latencies are taken under different loads. TPOT stays out of
    the two-sample tests: the zoo's answers are 2 to 8 tokens, so a request's TPOT is often near zero.
    """
    slo = {"ttft_ms": 2000, "e2e_ms": 5000, "attainment": "0.9"}
    paired = {"quality_margin": "0.08", "latency_metrics": [], "max_pairs_per_stage": 160, "look_every": 40,
              "graders": [{"name": "reference", "kind": "reference"}, {"name": "answered", "kind": "not-empty"}]}
    return GatePolicy.build(slice_keys=["family", "length"], quality_margin="0.08", error_margin="0.02",
                            min_samples_per_slice=30, max_samples_per_stage=160, look_every=40,
                            latency_metrics=["ttft", "e2e"], latency_margin="0.5", latency_fail_above="0.25",
                            latency_max_samples_per_stage=480, latency_look_every=120, slo=[slo], paired=paired,
                            two_sample_quality=False, futility_below="0.01")


USER_RATE = 0.5  # users' requests per second in the background (what one replica of `slow` carries here)


@contextmanager
def user_traffic(router_url: str, folder: Path, rate: float = USER_RATE,
                 mix: Mapping[str, float] | None = None, seconds: float = 3600, *,
                 gateway: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Users' traffic through the router from another process, open-loop, for as long as the block runs.

    Its requests name their task slices and carry no reference answers the flow could see: the gates
    judge them on latency, SLOs, errors and label-free checks. The slices count as evidence only
    through ``gateway``, a credential file the route trusts (the API gateway in front, which labels
    requests by product feature); callers' own labels are ignored. ``mix`` weights the task slices
    the users ask for (default: all alike); the traffic ends after ``seconds``.
    """
    trace = folder / "users.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    write_trace(generate_trace(int(rate * seconds), rate=rate, seed=11, labelled_fraction=0.0, mix=mix), trace)
    argv = [sys.executable, "-m", "revgate.cli.main", "replay", str(trace), "--target", router_url.rstrip("/") + "/v1",
            "--out", str(folder / "users-records.jsonl"),
            *(("--credential-file", str(gateway)) if gateway is not None else ())]
    with (folder / "users.log").open("ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        processes.stop(process)


def gateway_credential(folder: Path) -> Path:
    """The demo's stand-in for an API gateway's credential (made once, owner-only): the route trusts the
    slice labels of requests that carry it, as it would a gateway that sets them and strips callers' own."""
    path = folder / "gateway-credential"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_token(path, secrets.token_urlsafe(32))
    return path


def route_stable(routes: str, target: RevisionTarget, gateway: Path | None = None) -> RouteSnapshot:
    """Put ``target`` as the route's stable revision (a new generation on top of any history); the snapshot.

    With ``gateway``, the route trusts that credential's requests to declare their slices."""
    store = open_route_store(routes)
    now = datetime.now(UTC)
    current = store.read(ROUTE)
    trusted = (credential_digest(gateway),) if gateway is not None else ()
    if current is None:
        snapshot = RouteSnapshot(route=ROUTE, generation=1, stable=target, created_by="revgate demo", created_at=now,
                                 trusted_sources=trusted)
    else:
        snapshot = successor(current, by="revgate demo", now=now, stable=target, candidate=None, shadow=None,
                             failure_domains={}, trusted_sources=trusted, cohort_secret="", probe_credential="")
    store.write(snapshot)
    return snapshot


def identical_copy(source: Path, dest: Path) -> Path:
    """``source``'s files with a note beside them: the same behaviour under a new manifest digest.

    Made afresh each time (a few MB), so a rebuilt zoo never leaves a stale copy behind.
    """
    staging = dest.with_name(f".{dest.name}.copying")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    (staging / "REVISION.txt").write_text(COPY_NOTE, encoding="utf-8")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest


def candidate_folder(name: str, zoo_dir: Path, zoo_paths: Mapping[str, str], derived: Path) -> Path:
    """The folder a demo revision is published from: its zoo folder, or stable's for the A/A candidates."""
    if name == STABLE_COPY:
        return identical_copy(zoo_dir / zoo_paths["stable"], derived / name)
    # stable-reconfigured is stable's very artifact (the same digest): only its execution config differs.
    return zoo_dir / zoo_paths["stable" if name == STABLE_RECONFIGURED else name]


def candidate_execution(name: str) -> ExecutionConfig:
    """The execution config a demo candidate runs under; stable's own replica always keeps EXECUTION."""
    return RECONFIGURED if name == STABLE_RECONFIGURED else EXECUTION


def publish_revisions(names: tuple[str, ...], zoo_dir: Path, zoo_paths: Mapping[str, str], root: Path,
                      key: Path) -> dict[str, str]:
    """Sign and publish the named revisions; their manifest digests by name.

    Each folder is published once: the store is write-once, and a second signature of the same
    manifest (stable-reconfigured shares stable's) would be refused.
    """
    folders = {name: candidate_folder(name, zoo_dir, zoo_paths, root / "derived") for name in names}
    published = {folder: publish(folder, str(root / "artifacts"), key, root / "signatures")
                 for folder in dict.fromkeys(folders.values())}
    return {name: published[folder] for name, folder in folders.items()}


WARM = WarmProfile(prompt_lengths=(8, 16), max_tokens=8, concurrency=4, request_count=8)


@dataclass(frozen=True)
class DemoRollout:
    """One rollout of a demo session: its spec, the exit code of ``revgate promote``, its run page, when it ran."""

    candidate: str
    spec: PromotionSpec
    code: int
    run_page: str
    started_s: float
    ended_s: float


@dataclass
class DemoSession:
    """The demo's services up and its revisions published: rollouts of candidates on ROUTE, one at a time."""

    root: Path
    digests: dict[str, str]
    signature: SignaturePolicySpec
    token: Path
    env: dict[str, str]
    worker_url: str
    stable: ServiceRevision
    stable_view: ReplicaView | None = None
    public_url: str = ""
    admin_url: str = ""
    record_signers: dict[str, str] = field(default_factory=dict)  # the router whose signed records count

    @property
    def routes(self) -> str:
        """The route store."""
        return str(self.root / "routes")

    @property
    def gateway(self) -> Path:
        """The users' gateway credential: the route trusts the slices its requests declare."""
        return gateway_credential(self.root / "keys")

    @property
    def client(self) -> WorkerClient:
        """The worker agent's client."""
        return WorkerClient(self.worker_url, self.token.read_text().strip())

    def start_stable(self) -> None:
        """A fresh replica of stable, loaded and warmed."""
        request = ReplicaRequest(revision=self.stable, store=str(self.root / "artifacts"),
                                 signature_policy=self.signature, warm=WARM)
        self.stable_view = start_replica(self.client, request)
        print(f"stable replica ready at {self.stable_view.endpoint}")

    def stable_target(self) -> RevisionTarget:
        """The route target of stable's replica."""
        assert self.stable_view is not None, "start_stable first"
        return RevisionTarget(fingerprint=self.stable.fingerprint, endpoints=(self.stable_view.endpoint,),
                              served_model=self.stable_view.served_model,
                              limits=serving_limits(self.stable.interface))

    def spec(self, candidate: str, approval: str) -> PromotionSpec:
        """The promotion of ``candidate`` against the route's stable, with the demo's plan and gate policy."""
        root, token = self.root, str(self.token)
        return PromotionSpec(
            route=ROUTE, candidate_manifest=self.digests[candidate], candidate_name=candidate,
            artifact_store=str(root / "artifacts"), route_store=self.routes, signature=self.signature,
            execution=candidate_execution(candidate), warm=WARM, gate_policy=demo_policy(), plan=demo_plan(),
            worker_url=self.worker_url, worker_token_file=token, router_url=self.public_url,
            router_admin_url=self.admin_url, router_admin_token_file=token, records_sink=str(root / "records"),
            record_signers=self.record_signers,
            trace=str(root / "trace.jsonl"), batch_size=200,
            tracking_uri=f"sqlite:///{(root / 'mlflow.db').resolve()}", evidence_root=str(root / "evidence"),
            approval=approval, controller_key_file=str(signing_key(root / "keys", "controller")[0]),
        )

    def rollout(self, candidate: str, approval: str = "auto", *, log: Path | None = None) -> DemoRollout:
        """``promote_revision`` for ``candidate``, from stable alone on the route, to its decision.

        Its output is passed through, or appended to ``log``.
        """
        self.restore_stable()
        spec = self.spec(candidate, approval)
        spec_file = self.root / "promotion.json"
        spec_file.write_text(spec.model_dump_json(indent=2), encoding="utf-8")
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
        started = time.time()
        code, run_page = promote_and_echo(spec_file, {**os.environ, **self.env}, log)
        return DemoRollout(candidate, spec, code, run_page, started, time.time())

    def restore_stable(self) -> None:
        """Stable alone on the route, on a ready replica, and no other replica up; nothing to do on a fresh session.

        A promotion retires the old stable's replica after its rollback window, so a fresh one is
        started then; the promoted candidate's replica is drained once stable has the route back, so
        the next candidate loads on free cores.
        """
        client = self.client
        settle(client)
        assert self.stable_view is not None, "start_stable first"
        if client.replica(self.stable_view.replica_id).state != "ready":
            self.start_stable()
        current = open_route_store(self.routes).read(ROUTE)
        if current is None or current.stable != self.stable_target() or current.candidate or current.shadow:
            self.await_router(route_stable(self.routes, self.stable_target(), self.gateway).generation)
        for replica in client.replicas():
            if replica.live and replica.replica_id != self.stable_view.replica_id:
                client.drain(replica.replica_id, 5)
        settle(client)

    def await_router(self, generation: int, timeout_s: float = 30) -> None:
        """Tell the router of a new generation and wait until it serves it."""
        admin = RouterAdmin.from_token_file(self.admin_url, str(self.token))
        admin.notify()
        deadline = time.monotonic() + timeout_s
        while admin.health().generation < generation:
            if time.monotonic() > deadline:
                raise processes.ServiceFailed(f"the router does not serve generation {generation} yet",
                                              where=self.admin_url, fix="Read router/router.log in the demo state.")
            time.sleep(0.25)


def settle(client: WorkerClient, timeout_s: float = 120) -> None:
    """Until no replica on the worker is draining: a replica's cores are free for the next one only once it ends."""
    deadline = time.monotonic() + timeout_s
    while any(replica.state == "draining" for replica in client.replicas()):
        if time.monotonic() > deadline:
            raise processes.ServiceFailed(f"replicas still draining after {timeout_s:g} s", where=client.url,
                                          fix="Read the worker's log (worker/worker.log in the demo state).")
        time.sleep(0.5)


@contextmanager
def demo_session(root: Path, zoo_dir: Path, candidates: tuple[str, ...] = ("improved",), zoo_scale: float = 1.0,
                 *, users_s: float = 3600) -> Iterator[DemoSession]:
    """The demo's set-up, for as long as the block runs: the zoo, the signed revisions, a Prefect server, a worker
    agent with stable's replica on the route, a router, and ``users_s`` seconds of users' traffic through it."""
    from revgate.zoo.build import make_zoo
    from revgate.zoo.recipe import default_zoo

    zoo = make_zoo(zoo_dir, default_zoo(zoo_scale))
    key, public = signing_key(root / "keys")
    digests = publish_revisions(("stable", *candidates), zoo_dir, {n: r.path for n, r in zoo.items()}, root, key)
    named = ", ".join(f"{name} {digests[name][:19]}" for name in candidates)
    print(f"published stable {digests['stable'][:19]} and {named}, signed")
    write_trace(generate_trace(1200, rate=40.0, seed=7), root / "trace.jsonl")
    token = processes.token_file(root / "token")
    with ExitStack() as services:
        auth_file = root / "prefect-auth"
        env = services.enter_context(processes.prefect_server(root / "prefect", auth_file=auth_file))
        print(f"Prefect server at {env['PREFECT_API_URL'].removesuffix('/api')}, behind basic auth: "
              f"the UI asks for the user:password in {auth_file}")
        worker_url = services.enter_context(processes.worker_agent(root / "worker", token))
        stable = ServiceRevision(
            name="stable", artifact=open_store(str(root / "artifacts")).get_manifest(digests["stable"]),
            runtime=engine_runtime(Path(".venv-engine")), execution=EXECUTION, interface=InterfacePolicy(),
        )
        session = DemoSession(root, digests, SignaturePolicySpec(kind="key", public_key=str(public)), token, env,
                              worker_url, stable)
        session.start_stable()
        route_stable(session.routes, session.stable_target(), session.gateway)
        records_key, session.record_signers = router_key(root / "keys", DEMO_ROUTER)
        session.public_url, session.admin_url = services.enter_context(
            processes.router(session.routes, ROUTE, root / "router", token, sink=str(root / "records"),
                             router_id=DEMO_ROUTER, records_key=records_key))
        print(f"router at {session.public_url}, records in {root / 'records'}")
        services.enter_context(user_traffic(session.public_url, root / "users", seconds=users_s,
                                            gateway=session.gateway))
        print(f"users' traffic: {USER_RATE:g} requests/s, open-loop, from another process")
        yield session


def run_demo(
    root: Path, zoo_dir: Path, candidate: str = "improved", approval: str = "auto", zoo_scale: float = 1.0,
    *, stay_up: bool = False,
) -> int:
    """Run the whole promotion; prints where to look at the evidence. Exit code 0 when promoted.

    With ``stay_up`` everything keeps running after the decision (the Prefect UI, the MLflow UI,
    the router with users' traffic) until Ctrl-C or SIGTERM, so the three users can look.
    """
    print(f"revgate demo: state in {root}")
    with processes.sigterm_as_ctrl_c(), demo_session(root, zoo_dir, (candidate,), zoo_scale) as session:
        how = "approval given automatically" if approval == "auto" else "approve it in the Prefect UI"
        print(f"running promote_revision ({how})")
        done = session.rollout(candidate, approval)
        print_outcome(done.spec)
        if stay_up:
            show_until_interrupted(session, done)
        return done.code


def print_outcome(spec: PromotionSpec) -> None:
    """The route's recent history and where the rollout's evidence is."""
    history = open_route_store(spec.route_store).history(ROUTE)
    print(json.dumps([{"generation": s.generation, "stable": s.stable.short,
                       "candidate": s.candidate.short if s.candidate else None,
                       "weight_ppm": s.candidate.weight_ppm if s.candidate else 0,
                       "shadow": s.shadow.short if s.shadow else None} for s in history[-8:]], indent=1))
    print(f"evidence: MLflow store {spec.tracking_uri} (mlflow ui --backend-store-uri {spec.tracking_uri})")
    tried = [s.candidate or s.shadow for s in history if s.candidate or s.shadow]
    if tried and tried[-1] is not None:
        public = Path(spec.controller_key_file).with_suffix(".pub")
        print(f"audit it: revgate evidence --tracking-uri {spec.tracking_uri} --routes {spec.route_store} "
              f"--controller-key {public} {tried[-1].fingerprint}")


def show_until_interrupted(session: DemoSession, done: DemoRollout) -> None:
    """The MLflow UI beside the other services, and the tour, until Ctrl-C or SIGTERM."""
    with processes.mlflow_ui(done.spec.tracking_uri, session.root / "mlflow-ui.log") as mlflow_ui:
        prefect_ui = session.env["PREFECT_API_URL"].removesuffix("/api")
        print_tour(Tour(prefect_ui, session.root / "prefect-auth", done.run_page, mlflow_ui,
                        done.spec.model_name, session.public_url, session.admin_url, session.routes,
                        session.token, session.worker_url, done.spec.tracking_uri, session.env["PREFECT_API_URL"]))
        processes.wait_for_interrupt()
        print("stopping the demo's services")


def promote_and_echo(spec_file: Path, env: Mapping[str, str], log: Path | None = None) -> tuple[int, str]:
    """``revgate promote SPEC`` with its output passed through (or appended to ``log``); its exit code and the
    flow run's page. A caller that stops early (an error, Ctrl-C) stops the promotion with it."""
    process = subprocess.Popen([sys.executable, "-m", "revgate.cli.main", "promote", str(spec_file)], env=dict(env),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    run_page = ""
    with ExitStack() as finish:
        finish.callback(processes.stop, process)  # at once if it has ended
        out = finish.enter_context(log.open("a", encoding="utf-8")) if log is not None else sys.stdout
        for line in process.stdout:
            print(line, end="", flush=True, file=out)
            if not run_page and (found := RUN_PAGE.search(line)):
                run_page = found.group(0)
        return process.wait(), run_page


RUN_PAGE = re.compile(r"https?://\S+/runs/flow-run/[0-9a-f-]+")


@dataclass(frozen=True)
class Tour:
    """What the demo leaves up, for the three users."""

    prefect_ui: str
    auth_file: Path
    run_page: str
    mlflow_ui: str
    model: str
    router_url: str
    router_admin: str
    routes: str
    token: Path
    worker_url: str
    tracking_uri: str
    prefect_api: str


def print_tour(tour: Tour) -> None:
    """Where each of the three users looks, and what to click."""
    print(f"""
The demo stays up; Ctrl-C stops everything.
  Release manager, Prefect UI: {tour.prefect_ui} (it asks for the user:password in {tour.auth_file})
    the rollout's run: {tour.run_page or tour.prefect_ui + '/runs'}
    open it, then "Artifacts" for the gate reports; a paused run shows the approval form
  Auditor, MLflow UI: {tour.mlflow_ui}/#/models/{tour.model}
    open the latest version: its description says the decision, who approved and the gates;
    its source run holds every document, gate report and plot
  ML engineer, the router: {tour.router_url}/v1 (users' traffic keeps running through it)
    PREFECT_API_AUTH_STRING="$(cat {tour.auth_file})" \\
    revgate status {ROUTE} --routes {tour.routes} --router {tour.router_admin} --router-token-file {tour.token} \\
      --worker {tour.worker_url} --worker-token-file {tour.token} --mlflow-ui {tour.mlflow_ui} \\
      --tracking-uri {tour.tracking_uri} --prefect-api {tour.prefect_api}
""", flush=True)
