"""The embedded default end to end: a full promotion on one machine.

Builds (or reuses) the reference zoo, signs and publishes two revisions, starts a Prefect server,
a worker agent running vLLM on the CPU and a router, puts the stable revision on a route, then
runs ``promote_revision`` for the candidate through shadow and canary stages to a decision.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from evaluation.traces import generate_trace, write_trace
from flows import processes
from flows.spec import PromotionSpec
from flows.steps import start_replica
from manifests.gates import GatePolicy
from manifests.revision import ExecutionConfig, InterfacePolicy, ServiceRevision
from manifests.rollout import Analyze, Approve, RolloutPlan, SetWeight, Shadow
from manifests.route import RevisionTarget, RouteSnapshot
from manifests.route_change import successor
from manifests.worker import WarmProfile
from registry.build import build_manifest
from registry.route_store import open_route_store
from registry.runtime import engine_runtime
from registry.signing import sign_with_key
from registry.store import open_store
from serving.worker.client import WorkerClient
from serving.worker.request import ReplicaRequest, SignaturePolicySpec

ROUTE = "demo"
EXECUTION = ExecutionConfig(dtype="float32", max_model_len=64, kv_cache_bytes=64 * 2**20, enforce_eager=True)


def signing_key(folder: Path) -> tuple[Path, Path]:
    """A P-256 key pair for the demo's publisher (made once)."""
    private, public = folder / "publisher.key", folder / "publisher.pub"
    if not private.exists():
        folder.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        private.chmod(0o600)
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def publish(model_dir: Path, store: str, key: Path, folder: Path) -> str:
    """Build the manifest, sign it, push folder and signature; the pinned manifest digest."""
    manifest = build_manifest(model_dir)
    signature = folder / f"{manifest.digest[7:19]}.sig"
    folder.mkdir(parents=True, exist_ok=True)
    sign_with_key(manifest, signature, key, model_name=model_dir.name)
    return open_store(store).push(model_dir, manifest, signature)


def demo_plan() -> RolloutPlan:
    """Shadow everything, approve, then a 50% canary: small enough for one CPU machine.

    Each analyse step sends enough requests for every task slice to reach the gate policy's
    per-slice horizon in each arm (1,200 mirrored; 2,400 at a 50% split).
    """
    return RolloutPlan(steps=(
        Shadow(sample_ppm=1_000_000), Analyze(max_samples=1200), Approve(),
        SetWeight(weight_ppm=500_000), Analyze(max_samples=2400),
    ), lease_seconds=600, rollback_window_seconds=5)


def demo_policy() -> GatePolicy:
    """Per-slice (task family x length) quality, canary latency and SLO gates; sized for a one-machine demo.

    Six task slices share each stage's requests, about 200 per slice and arm; the horizon sits
    below that so that the last planned look is reached even when the random mix runs short. With
    so few samples an 8-point quality margin and a 2-point error margin are what can be shown; a
    slice that is measurably worse fails whatever the margin. Latency is judged in the canary, where
    both revisions serve the same mix of requests side by side under the same load: two-sample
    tests of log TTFT and log E2E, failing when the candidate is shown more than 1.15x slower, passing
    when shown within 1.5x. The engines sit on cores of their own, so whatever else runs on the host
    lands on one of them: identical revisions measured 1.18x apart with their cores swapped, and
    `improved` came out 1.79x stable's E2E over the first ten seconds of one canary while a browser
    closed on the host (0.94x over the whole of another). So slowdowns under 1.15x are not failed, and
    the latency looks come every 120 samples per arm up to 480, past a few seconds' transient.

    Not in shadow: there stable serves the probes and the users at once while the shadow answers
    the mirror's copies after stable's answers, so a pair's two latencies are taken under different
    loads (measured on one stage of `slow`: its paired E2E drifted from 1.4x stable's to
    0.4x as the mirror's backlog drained; its paired TPOT ranged 0.4x to 2.35x between runs). TPOT
    stays out of the two-sample tests: the zoo's answers are 2 to 8 tokens, often streamed several
    to a chunk, so a request's TPOT is often near zero and its log dominates the mean (improved
    measured 46x stable's TPOT at the first canary look). Measured in the canary with this plan:
    `slow` 1.97x stable's E2E, failed at 240 samples per arm (TTFT 1.49x, undecided there);
    `improved` 1.01x and 0.97x, passed at 240. In shadow, quality is graded
    against the probes' reference answers and, for users' prompts, by a label-free check.
    """
    slo = {"ttft_ms": 2000, "e2e_ms": 5000, "attainment": "0.9"}
    paired = {"quality_margin": "0.08", "latency_metrics": [], "max_pairs_per_stage": 160, "look_every": 40,
              "graders": [{"name": "reference", "kind": "reference"}, {"name": "answered", "kind": "not-empty"}]}
    return GatePolicy.build(slice_keys=["family", "length"], quality_margin="0.08", error_margin="0.02",
                            min_samples_per_slice=30, max_samples_per_stage=160, look_every=40,
                            latency_metrics=["ttft", "e2e"], latency_margin="0.5", latency_fail_above="0.15",
                            latency_max_samples_per_stage=480, latency_look_every=120, slo=[slo], paired=paired)


USER_RATE = 0.5  # users' requests per second in the background (what one replica of `slow` carries here)


@contextmanager
def user_traffic(router_url: str, folder: Path, rate: float = USER_RATE,
                 mix: Mapping[str, float] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Users' traffic through the router from another process, open-loop, for as long as the block runs.

    Its requests declare their task slices (as a client may) but carry no reference answers the
    flow could see: the gates judge them on latency, SLOs, errors and label-free checks. ``mix``
    weights the task slices the users ask for (default: all alike).
    """
    trace = folder / "users.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    write_trace(generate_trace(int(rate * 3600), rate=rate, seed=11, labelled_fraction=0.0, mix=mix), trace)
    argv = [sys.executable, "-m", "cli.main", "replay", str(trace), "--target", router_url.rstrip("/") + "/v1",
            "--out", str(folder / "users-records.jsonl")]
    with (folder / "users.log").open("ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        processes.stop(process)


def route_stable(routes: str, target: RevisionTarget) -> None:
    """Put ``target`` as the route's stable revision (a new generation on top of any history)."""
    store = open_route_store(routes)
    now = datetime.now(UTC)
    current = store.read(ROUTE)
    if current is None:
        store.write(RouteSnapshot(route=ROUTE, generation=1, stable=target, created_by="revgate demo", created_at=now))
    else:
        store.write(successor(current, by="revgate demo", now=now, stable=target, candidate=None, shadow=None,
                              failure_domains={}))


def run_demo(
    root: Path, zoo_dir: Path, candidate: str = "improved", approval: str = "auto", zoo_scale: float = 1.0,
    *, stay_up: bool = False,
) -> int:
    """Run the whole promotion; prints where to look at the evidence. Exit code 0 when promoted.

    With ``stay_up`` everything keeps running after the decision (the Prefect UI, the MLflow UI,
    the router with users' traffic) until Ctrl-C or SIGTERM, so the three users can look.
    """
    print(f"revgate demo: state in {root}")
    from zoo.build import make_zoo
    from zoo.recipe import default_zoo

    zoo = make_zoo(zoo_dir, default_zoo(zoo_scale))
    key, public = signing_key(root / "keys")
    store = str(root / "artifacts")
    signatures = root / "signatures"
    digests = {name: publish(zoo_dir / zoo[name].path, store, key, signatures) for name in ("stable", candidate)}
    print(f"published stable {digests['stable'][:19]} and {candidate} {digests[candidate][:19]}, signed")
    policy = SignaturePolicySpec(kind="key", public_key=str(public))
    trace = root / "trace.jsonl"
    write_trace(generate_trace(1200, rate=40.0, seed=7), trace)
    token = processes.token_file(root / "token")
    routes, router_state, sink = str(root / "routes"), root / "router", root / "records"
    with ExitStack() as services:
        auth_file = root / "prefect-auth"
        env = services.enter_context(processes.prefect_server(root / "prefect", auth_file=auth_file))
        print(f"Prefect server at {env['PREFECT_API_URL'].removesuffix('/api')}, behind basic auth: "
              f"the UI asks for the user:password in {auth_file}")
        worker_url = services.enter_context(processes.worker_agent(root / "worker", token))
        client = WorkerClient(worker_url, token.read_text().strip())
        stable_revision = ServiceRevision(
            name="stable", artifact=open_store(store).get_manifest(digests["stable"]),
            runtime=engine_runtime(Path(".venv-engine")), execution=EXECUTION, interface=InterfacePolicy(),
        )
        warm = WarmProfile(prompt_lengths=(8, 16), max_tokens=8, concurrency=4, request_count=8)
        view = start_replica(client, ReplicaRequest(revision=stable_revision, store=store, signature_policy=policy,
                                                   warm=warm))
        print(f"stable replica ready at {view['endpoint']}")
        route_stable(routes, RevisionTarget(fingerprint=stable_revision.fingerprint,
                                                       endpoints=(str(view["endpoint"]),),
                                                       served_model=str(view["served_model"])))
        public_url, admin_url = services.enter_context(
            processes.router(routes, ROUTE, router_state, token, sink=str(sink)))
        print(f"router at {public_url}, records in {sink}")
        services.enter_context(user_traffic(public_url, root / "users"))
        print(f"users' traffic: {USER_RATE:g} requests/s, open-loop, from another process")
        spec = PromotionSpec(
            route=ROUTE, candidate_manifest=digests[candidate], candidate_name=candidate, artifact_store=store,
            route_store=routes, signature=policy, execution=EXECUTION, warm=warm,
            gate_policy=demo_policy(), plan=demo_plan(), worker_url=worker_url, worker_token_file=str(token),
            router_url=public_url, router_admin_url=admin_url, router_admin_token_file=str(token),
            records_sink=str(sink), router_records=str(router_state / "records.jsonl"),
            trace=str(trace), batch_size=200,
            tracking_uri=f"sqlite:///{(root / 'mlflow.db').resolve()}", evidence_root=str(root / "evidence"),
            approval=approval,
        )
        spec_file = root / "promotion.json"
        spec_file.write_text(spec.model_dump_json(indent=2), encoding="utf-8")
        how = "approval given automatically" if approval == "auto" else "approve it in the Prefect UI"
        print(f"running promote_revision ({how})")
        code, run_page = promote_and_echo(spec_file, {**os.environ, **env})
        history = open_route_store(routes).history(ROUTE)
        print(json.dumps([{"generation": s.generation, "stable": s.stable.short,
                           "candidate": s.candidate.short if s.candidate else None,
                           "weight_ppm": s.candidate.weight_ppm if s.candidate else 0,
                           "shadow": s.shadow.short if s.shadow else None} for s in history[-8:]], indent=1))
        print(f"evidence: MLflow store {spec.tracking_uri} (mlflow ui --backend-store-uri {spec.tracking_uri})")
        tried = [s.candidate or s.shadow for s in history if s.candidate or s.shadow]
        if tried and tried[-1] is not None:
            print(f"audit it: revgate evidence --tracking-uri {spec.tracking_uri} {tried[-1].fingerprint}")
        if stay_up:
            mlflow_ui = services.enter_context(processes.mlflow_ui(spec.tracking_uri, root / "mlflow-ui.log"))
            prefect_ui = env["PREFECT_API_URL"].removesuffix("/api")
            print_tour(Tour(prefect_ui, root / "prefect-auth", run_page, mlflow_ui, spec.registered_model, public_url,
                            admin_url, routes, token, worker_url))
            processes.wait_for_interrupt()
            print("stopping the demo's services")
        return code


def promote_and_echo(spec_file: Path, env: Mapping[str, str]) -> tuple[int, str]:
    """``revgate promote SPEC`` with its output passed through; its exit code and the flow run's page."""
    process = subprocess.Popen([sys.executable, "-m", "cli.main", "promote", str(spec_file)], env=dict(env),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    run_page = ""
    for line in process.stdout:
        print(line, end="", flush=True)
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
    revgate status {ROUTE} --routes {tour.routes} --router {tour.router_admin} --router-token-file {tour.token} \\
      --worker {tour.worker_url} --worker-token-file {tour.token} --mlflow-ui {tour.mlflow_ui}
""", flush=True)
