"""Gates on users' traffic alone: the flow sends no probes, and the stage's evidence is what the
router wrote to the record sink while users' requests ran through it from another process.

Real parts throughout: a worker agent with vLLM on the CPU, the router with its record sink, the
promotion flow as `revgate promote` against the Prefect server, MLflow for the evidence. The judge
of the shadow test is a scripted OpenAI-compatible server (the zoo's models are too small to
judge): it works the reference task out from the user's prompt and prefers the right answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from revgate.evaluation import metrics
from revgate.evaluation.reference_task import TASK_SLICES
from revgate.evaluation.replay import replay
from revgate.evaluation.traces import generate_trace
from revgate.flows.demo import EXECUTION, gateway_credential, user_traffic
from revgate.flows.processes import router
from revgate.flows.spec import PromotionSpec
from revgate.manifests.gates import GatePolicy
from revgate.manifests.rollout import Analyze, Bake, RolloutPlan, SetWeight, Shadow
from revgate.manifests.route import RouteSnapshot
from revgate.registry.route_store import open_route_store
from revgate.serving.token_file import credential_digest
from tests.integration.gate_reports import evidence_counts, gate, last_report
from tests.integration.judge_server import judge_server, reference_task_judge
from tests.integration.rollout_estate import WARM, Estate, estate

pytestmark = [pytest.mark.engine, pytest.mark.servers, pytest.mark.gated]

SORT_LONG = {**{name: 0.0 for name in TASK_SLICES}, "sort/long": 1.0}  # users who only ask long sorts


@pytest.fixture(scope="module")
def live(zoo_dir: Path, prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Estate]:
    with estate(zoo_dir, prefect_api, tmp_path_factory.mktemp("live"),
                ("stable", "slow", "slice-regressed", "improved")) as e:
        yield e


@dataclass
class Ended:
    """How a rollout ended: the command's exit and output, the route's history, its last gate report."""

    code: int
    output: str
    history: list[RouteSnapshot]
    report: dict[str, Any]


def roll_out(
    live: Estate, folder: Path, route: str, candidate: str, *, plan: RolloutPlan, policy: GatePolicy, rate: float,
    mix: dict[str, float] | None = None, judge_url: str = "",
    beside: Any = None,
) -> Ended:
    """Run ``revgate promote`` for ``candidate`` with the probes off while users' traffic runs
    (``beside(public_url, routes)``: a context manager of more traffic for the same time)."""
    folder.mkdir(parents=True, exist_ok=True)
    routes, sink = str(folder / "routes"), str(folder / "records")
    gateway = gateway_credential(folder)  # the users' slices are evidence: they come through a trusted gateway
    open_route_store(routes).write(RouteSnapshot(route=route, generation=1, stable=live.stable(), created_by="seed",
                                                 created_at=datetime.now(UTC),
                                                 trusted_sources=(credential_digest(gateway),)))
    tracking = f"sqlite:///{(folder / 'mlflow.db').resolve()}"
    with (router(routes, route, folder / "router", live.token, sink=sink) as (public, admin),
          user_traffic(public, folder / "users", rate, mix, gateway=gateway),
          beside(public, routes) if beside is not None else contextlib.nullcontext()):
        spec = PromotionSpec(
            route=route, candidate_manifest=live.digests[candidate], candidate_name=candidate,
            artifact_store=live.store, route_store=routes, signature=live.policy, execution=EXECUTION, warm=WARM,
            gate_policy=policy, plan=plan, worker_url=live.worker_url, worker_token_file=str(live.token),
            router_url=public, router_admin_url=admin, router_admin_token_file=str(live.token), records_sink=sink,
            trace=str(folder / "unused-trace.jsonl"),
            probes=False, batch_size=20, user_wait_s=60, judge_url=judge_url, judge_model="judge-7b",
            tracking_uri=tracking, evidence_root=str(folder / "evidence"), approval="auto",
        )
        spec_file = folder / "promotion.json"
        spec_file.write_text(spec.model_dump_json(indent=2), encoding="utf-8")
        result = subprocess.run([sys.executable, "-m", "revgate.cli.main", "promote", str(spec_file)],
                                env={**os.environ, "PREFECT_API_URL": live.prefect_api}, capture_output=True,
                                text=True, timeout=900, check=False)
    output = result.stdout[-4000:] + result.stderr[-4000:]
    analyzed = any(isinstance(step, Analyze) for step in plan.steps)
    report = last_report(MlflowClient(tracking), folder, route)[1] if analyzed else {}
    return Ended(result.returncode, output, list(open_route_store(routes).history(route)), report)


def stable_tpot_ms(live: Estate) -> float:
    """Stable's median time per output token on long sorts, one request at a time, straight to its replica."""
    target = live.stable()
    trace = generate_trace(12, rate=1000.0, seed=5, mix=SORT_LONG, labelled_fraction=0.0)
    result = asyncio.run(replay(trace, target.endpoints[0] + "/v1", target.served_model or "stable",
                          max_in_flight=1))
    return float(statistics.median(metrics.latencies_ms(result.records, "tpot")))


def test_a_slow_canary_fails_its_slo_from_users_traffic_alone(live: Estate, tmp_path: Path) -> None:
    # The SLO sits at twice stable's own time per token, measured here: `slow` needs about 3.5x.
    target_ms = max(1, round(2 * stable_tpot_ms(live)))
    policy = GatePolicy.build(slice_keys=["family", "length"], error_margin="0.02", min_samples_per_slice=30,
                              max_samples_per_stage=160, look_every=40, latency_metrics=[],
                              slo=[{"tpot_ms": target_ms, "attainment": "0.9"}])
    plan = RolloutPlan(steps=(SetWeight(weight_ppm=500_000), Analyze(max_samples=400)), lease_seconds=600,
                       rollback_window_seconds=5)
    ended = roll_out(live, tmp_path, "live-canary", "slow", plan=plan, policy=policy, rate=2.0, mix=SORT_LONG)

    assert ended.code != 0 and "decision: rolled_back" in ended.output, ended.output
    stable = ended.history[0].stable.fingerprint
    assert all(s.stable.fingerprint == stable for s in ended.history)
    assert any(s.candidate is not None for s in ended.history) and ended.history[-1].candidate is None
    slo = gate(ended.report, "slo-*")
    assert ended.report["outcome"] == "fail" and slo["outcome"] == "fail", (slo, target_ms)
    assert float(slo["numbers"]["attainment"]) < float(slo["numbers"]["stable_attainment"]), slo
    counts = evidence_counts(ended.report)  # users' requests only, on both arms
    assert counts["stable_probes"] == counts["candidate_probes"] == 0, counts
    assert counts["candidate_users"] > 0 and counts["stable_users"] > 0, counts
    # Side by side on one host, each engine computed on its own cores.
    cores = {r.revision: tuple(r.cpu_cores) for r in live.client.replicas() if r.cpu_cores}
    assert len(set(cores.values())) == len(cores) == 2, cores


def test_a_slice_regression_fails_in_shadow_from_the_judge_on_users_prompts(live: Estate, tmp_path: Path) -> None:
    asked: list[dict[str, Any]] = []
    paired = {"quality_margin": "0.08", "latency_metrics": [], "max_pairs_per_stage": 160, "look_every": 40,
              "graders": [{"name": "judge", "kind": "judge-pairwise", "rubric": "Prefer the answer that solves it."}]}
    policy = GatePolicy.build(slice_keys=["family", "length"], min_samples_per_slice=30, max_samples_per_stage=160,
                              look_every=40, latency_metrics=[], paired=paired)
    plan = RolloutPlan(steps=(Shadow(sample_ppm=1_000_000), Analyze(max_samples=800)), lease_seconds=600,
                       rollback_window_seconds=5)
    with judge_server(reference_task_judge(), asked) as judge_url:
        ended = roll_out(live, tmp_path, "live-shadow", "slice-regressed", plan=plan, policy=policy, rate=3.0,
                         mix=SORT_LONG, judge_url=judge_url)

    assert ended.code != 0 and "decision: rolled_back" in ended.output, ended.output
    stable = ended.history[0].stable.fingerprint
    assert all(s.stable.fingerprint == stable for s in ended.history)
    assert any(s.shadow is not None for s in ended.history) and ended.history[-1].shadow is None
    quality = gate(ended.report, "quality-paired")
    failed = [s["slice"] for s in quality["slices"] if s["outcome"] == "fail"]
    assert quality["outcome"] == "fail" and failed == ["judge/family=sort,length=long"], quality
    counts = evidence_counts(ended.report)
    assert counts["stable_probes"] == counts["candidate_probes"] == 0 and counts["candidate_users"] > 0, counts
    # The judge read the users' own prompts, each pair asked twice with the answers swapped.
    assert asked and all("Request:\nsort " in body["messages"][0]["content"] for body in asked)
    assert len(asked) % 2 == 0


def test_the_rollback_window_reads_every_routers_records_from_the_sink(live: Estate, tmp_path: Path) -> None:
    # The defect: the window read one router's local records file; the production configuration (records
    # on the sink only) left it empty, and the window watched nothing and just slept.
    policy = GatePolicy.build(slice_keys=["family"], min_samples_per_slice=10, max_samples_per_stage=60,
                              look_every=20, latency_metrics=[])
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Bake(seconds=10)], lease_seconds=600,
                             rollback_window_seconds=20, post_promotion={"min_requests": 5})
    ended = roll_out(live, tmp_path, "live-window", "improved", plan=plan, policy=policy, rate=3.0)
    assert ended.code == 0 and "decision: promoted" in ended.output, ended.output
    client = MlflowClient(f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}")
    experiment = client.get_experiment_by_name("revgate/live-window")
    assert experiment is not None
    run = client.search_runs([experiment.experiment_id])[0]
    window = json.loads(Path(client.download_artifacts(run.info.run_id, "evidence/rollback-window.json",
                                                       str(tmp_path))).read_text())
    assert window["outcome"] == "healthy" and window["requests"] >= 5, window  # the promoted revision's users
    assert window["baseline_requests"] > 0, window  # the old stable's, while both served
    assert run.data.tags["revgate.rollback_window"].startswith("ended healthy: "), run.data.tags


@contextlib.contextmanager
def hostile_tenant(public: str, routes: str, route: str, rate: float, sent: list[int]) -> Iterator[None]:
    """A tenant steering the evidence with everything a caller can send, ``rate`` requests a second: sessions
    chosen for the canary from the route's name and the candidate's fingerprint (as the salt was), a 1 ms
    deadline, a malformed request the engine refuses (400), a declared slice, probe class and task, and
    the ids of the flow's probes. Each status it got is put in ``sent``."""
    import httpx

    from revgate.serving.router.split import bucket_ppm

    stop = threading.Event()

    def chosen_sessions() -> Iterator[str]:
        while not stop.is_set():
            current = open_route_store(routes).read(route)
            if current is not None and current.candidate is not None:
                salt = f"{route}|{current.candidate.fingerprint}".encode()
                yield from (f"t-{n}" for n in range(10**6) if bucket_ppm(salt, f"t-{n}".encode()) < 500_000)
            stop.wait(0.5)

    def run() -> None:
        steer = {"x-revgate-slices": "family=sort;length=long", "x-revgate-class": "probe", "x-revgate-task": "sort"}
        with httpx.Client(timeout=30) as client:
            for number, session in enumerate(chosen_sessions()):
                if stop.is_set():
                    return
                headers = {"x-session-id": session, "x-request-id": f"step01-b0-t{number}", **steer}
                body: dict[str, Any] = {"model": route, "prompt": "sort: 3 1 2 =", "max_tokens": 8}
                if number % 2:
                    headers["x-revgate-timeout-ms"] = "1"
                else:
                    body["max_tokens"] = -1
                try:
                    sent.append(client.post(f"{public}/v1/completions", json=body, headers=headers).status_code)
                except httpx.HTTPError:
                    sent.append(0)
                stop.wait(1 / rate)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def test_a_hostile_tenant_cannot_fail_a_good_canary(live: Estate, tmp_path: Path) -> None:
    # The reproduction, at a tenth of the traffic through a whole canary of `improved`: with the gates as
    # they are, every request it sends is the caller's own doing, on whichever arm it landed.
    # Users carry no reference answers (no quality gate); errors, callers' outcomes and refusals decide.
    policy = GatePolicy.build(slice_keys=["family"], two_sample_quality=False, error_margin="0.1",
                              min_samples_per_slice=10, max_samples_per_stage=240, look_every=40, latency_metrics=[])
    plan = RolloutPlan(steps=(SetWeight(weight_ppm=500_000), Analyze(max_samples=400)), lease_seconds=600,
                       rollback_window_seconds=5)
    sent: list[int] = []
    ended = roll_out(live, tmp_path, "live-hostile", "improved", plan=plan, policy=policy, rate=3.0,
                     beside=lambda public, routes: hostile_tenant(public, routes, "live-hostile", 0.3, sent))
    outcomes = [(g["gate"], g["outcome"], g["reason"]) for g in ended.report.get("gates", [])]
    assert ended.code == 0 and "decision: promoted" in ended.output, (outcomes, ended.output[-1500:])
    assert len(sent) >= 5 and set(sent) <= {400, 504}, sent  # each was refused or ran out its own deadline
    counts = evidence_counts(ended.report)
    assert counts["stable_probes"] == counts["candidate_probes"] == 0, counts  # its "probe" class was ignored
    errors, callers = gate(ended.report, "errors"), gate(ended.report, "caller-outcomes")
    assert errors["outcome"] == "pass" and callers["outcome"] == "pass", (errors, callers)
    # Its requests are the callers' on both arms (counted there), and none is the candidate's own failure.
    theirs = {arm: int(callers["numbers"][f"{arm}_samples"]) - int(errors["numbers"][f"{arm}_samples"])
              for arm in ("candidate", "stable")}
    assert theirs["candidate"] >= 1 and theirs["stable"] >= 1 and sum(theirs.values()) <= len(sent), (theirs, sent)
