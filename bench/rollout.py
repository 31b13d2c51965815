"""Rollout benchmark: how fast a failing decision reaches the callers, and how fast a rollout starts.

One command: ``.venv/bin/python bench/rollout.py [--repeats 5] [--rate 20]``. Real parts: a Prefect
server, a worker agent running vLLM on the CPU (the zoo's stable and improved revisions, signed),
a router, MLflow on SQLite, and open-loop traffic through the router.

- ``trigger_to_first_canary_s``: ``revgate promote`` started to the first request the candidate
  served, less the candidate replica's load and warm-up (the worker's own timings); the plan's
  first step is the canary, so there is no bake before it. Goal: under 30 s on 2 cores.
- ``rollback_with_stable_warm_s`` and ``rollback_to_ready_stable_s``: ``revgate rollback``'s procedure
  after a promotion, from its start to the first request the old stable served: with the old stable's
  replica still warm (inside the window), then with it drained (after the window: its replica started
  through the agent, verified, loaded and warmed, and only then routed). One run, side by side.
- ``fail_to_stable_s``: from a failing gate decision fed to the flow's driver (the code path the
  flow takes after a failed analysis: state machine, fenced commit, router notify) to the first
  request from which every new request is served by stable; the worst of ``--repeats``, with the
  median beside it. The resolution is the traffic's interval (1 / rate). Goal: under 1 s.

The first figure runs at ``--trigger-rate`` (within what the worker measured the candidate can
carry: the capacity rule would pause the canary otherwise); the second puts the canary on the route
as the flow does and sends at ``--rate`` for a finer resolution.

Writes bench/results/rollout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

from revgate.flows import processes  # noqa: E402
from revgate.flows.promote import Promotion  # noqa: E402
from revgate.manifests.rollout import Analyze, Bake, RolloutPlan, SetWeight  # noqa: E402
from revgate.manifests.route import RevisionTarget  # noqa: E402
from revgate.manifests.route_change import canary, successor  # noqa: E402
from revgate.promotion.machine import GateDecided, StepApplied, advance  # noqa: E402
from revgate.registry.ledger import EvidenceLedger  # noqa: E402
from tests.integration.rollout_estate import Estate, OpenLoop, estate, rollout, wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "rollout.json"
LOAD_S = 900


def trigger_to_first_canary(parts: Estate, folder: Path, rate: float) -> tuple[float, dict[str, float], str]:
    """Run the real flow to its first canary request; the figure, its parts, and the candidate replica left ready."""
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Bake(seconds=3600)], lease_seconds=3600,
                             lease_renew_seconds=5, rollback_window_seconds=0)
    with rollout(parts, folder, "bench-trigger", plan, rate=rate) as handle:
        triggered = time.time()
        handle.start_flow()
        candidate = parts.revision("improved").fingerprint
        first = wait_until(lambda: handle.traffic.served_by(candidate), LOAD_S, "the first canary request")[0]
        views = [r for r in parts.client.replicas() if r.revision == candidate and r.state == "ready"]
        timings = {key: float(value) for key, value in views[0].timings_s.items()}
        # The controller dies here, so the candidate replica stays ready for the next measurement.
        assert handle.process is not None
        os.kill(handle.process.pid, signal.SIGKILL)
        handle.process.wait(30)
    elapsed = first.sent_s - triggered
    excluded = timings.get("load_s", 0.0) + timings.get("warm_s", 0.0)
    parts_s = {"elapsed_s": elapsed, "load_s": timings.get("load_s", 0.0), "warm_s": timings.get("warm_s", 0.0)}
    return elapsed - excluded, parts_s, str(views[0].replica_id)


def answered_after(traffic: OpenLoop, after_s: float) -> bool:
    """Whether a request sent after ``after_s`` has its answer."""
    return any(s.sent_s > after_s and s.status for s in traffic.sent)


def fail_to_stable(parts: Estate, folder: Path, replica_id: str, rate: float, repeats: int) -> list[float]:
    """Canary up, then a failing gate decision through the flow's driver; seconds until stable takes all."""
    view = parts.client.replica(replica_id)
    candidate = RevisionTarget(fingerprint=str(view.revision), endpoints=(str(view.endpoint),),
                               served_model=str(view.served_model))
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000), Analyze(max_samples=100)], lease_seconds=600,
                             rollback_window_seconds=0)
    seconds = []
    with rollout(parts, folder, "bench-fail", plan, rate=rate) as handle:
        ledger = EvidenceLedger(handle.spec.tracking_uri, folder / "mlflow-artifacts")
        run = ledger.open_run("bench-fail", candidate.fingerprint)
        for _ in range(repeats):
            # The canary at 50%, as the flow commits it (the capacity rule is the trigger figure's business).
            current = handle.current()
            now = datetime.now(UTC)
            handle.store.write(successor(current, by=handle.spec.created_by, now=now,
                                         candidate=canary(candidate, 500_000, now, 600)))
            driver = Promotion(handle.spec, ledger, run, candidate)
            driver.state = advance(plan, driver.state, StepApplied())  # on to the analysis
            since = time.time()
            wait_until(partial(handle.traffic.served_by, candidate.fingerprint, after_s=since), 60,
                       "the canary serving")
            decided = time.time()
            driver.state = advance(plan, driver.state, GateDecided("fail", "sha256:" + "f" * 64, reason="bench"))
            driver.apply_route()
            wait_until(partial(answered_after, handle.traffic, decided + 2), 30, "answers after the decision")
            last = max(s.sent_s for s in handle.traffic.served_by(candidate.fingerprint, after_s=since))
            seconds.append(max(0.0, last - decided) + 1 / rate)  # the next request was stable's
        ledger.close(run, "rolled_back")
    parts.client.drain(replica_id, 5)
    return seconds


def rollback_figures(parts: Estate, folder: Path, replica_id: str, rate: float) -> dict[str, float]:
    """``revgate rollback``'s procedure after a promotion, timed to the first request the old stable serves:
    with the old stable still warm, then with it drained (its replica started, verified and warmed anew)."""
    from revgate.flows.restore import restorer
    from revgate.flows.site import ROUTE_ONLY, RouteSite
    from revgate.rollback.land import land
    from revgate.serving.worker.engine import answers_health

    view = parts.client.replica(replica_id)
    promoted = RevisionTarget(fingerprint=str(view.revision), endpoints=(str(view.endpoint),),
                              served_model=str(view.served_model))
    plan = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)], rollback_window_seconds=0)
    figures = {}
    with rollout(parts, folder, "bench-rollback", plan, rate=rate) as handle:
        settings = RouteSite.model_validate_json(json.dumps({
            **handle.spec.model_dump(mode="json", include=set(RouteSite.model_fields) - ROUTE_ONLY),
            "policy": "p", "plan": "p", "candidates": {"stable": parts.digests["stable"]}}))
        old = handle.current().stable
        for name, drained in (("rollback_with_stable_warm_s", False), ("rollback_to_ready_stable_s", True)):
            now = datetime.now(UTC)
            handle.store.write(successor(handle.current(), by="flow", now=now, stable=promoted, candidate=None))
            wait_until(partial(handle.traffic.served_by, promoted.fingerprint, after_s=time.time()), 60,
                       "the promoted revision serving")
            if drained:
                for replica in parts.client.replicas():
                    if replica.revision == old.fingerprint and replica.state == "ready":
                        parts.client.drain(str(replica.replica_id), 5)
                wait_until(lambda: "ready" not in parts.states(old.fingerprint), 120, "the old stable drained")
            started = time.time()
            land(handle.store, handle.route, by="bench", now=lambda: datetime.now(UTC), answers=answers_health,
                 say=lambda line: None, restore=restorer(settings, say=lambda line: None))
            first = wait_until(partial(handle.traffic.served_by, old.fingerprint, after_s=started), LOAD_S,
                               "the old stable serving")[0]
            figures[name] = first.sent_s - started + 1 / rate
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate", type=float, default=10.0, help="open-loop requests per second (fail_to_stable_s)")
    parser.add_argument("--trigger-rate", type=float, default=1.5, help="open-loop requests per second (trigger)")
    args = parser.parse_args()
    from revgate.zoo.build import make_zoo
    from revgate.zoo.recipe import default_zoo

    zoo_dir = ROOT / ".cache" / "zoo"
    make_zoo(zoo_dir, default_zoo())
    with tempfile.TemporaryDirectory(prefix="revgate-bench-rollout-") as tmp:
        root = Path(tmp)
        with processes.prefect_server(root / "prefect") as env:
            os.environ.update(env)
            with estate(zoo_dir, env["PREFECT_API_URL"], root / "estate") as parts:
                trigger, trigger_parts, replica_id = trigger_to_first_canary(parts, root / "trigger", args.trigger_rate)
                rollbacks = rollback_figures(parts, root / "rollback", replica_id, args.rate)
                fails = fail_to_stable(parts, root / "fail", replica_id, args.rate, args.repeats)
    figures = {"fail_to_stable_s": round(max(fails), 3), "trigger_to_first_canary_s": round(trigger, 3),
               **{name: round(value, 3) for name, value in rollbacks.items()}}
    print(f"{'figure':<34}{'value':>10}{'goal':>10}")
    print(f"{'fail_to_stable_s (worst)':<34}{max(fails):>10.3f}{1.0:>10.1f}")
    print(f"{'fail_to_stable_s (median)':<34}{statistics.median(fails):>10.3f}")
    print(f"{'trigger_to_first_canary_s':<34}{trigger:>10.3f}{30.0:>10.1f}")
    for name, value in trigger_parts.items():
        print(f"  {name:<32}{value:>10.3f}")
    for name, value in rollbacks.items():
        print(f"{name:<34}{value:>10.3f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        **figures,
        "fail_to_stable_s_median": round(statistics.median(fails), 3),
        "fail_to_stable_s_each": [round(s, 3) for s in fails],
        "trigger_parts_s": {k: round(v, 3) for k, v in trigger_parts.items()},
        "rate_rps": args.rate,
        "trigger_rate_rps": args.trigger_rate,
        "repeats": args.repeats,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "command": "python bench/rollout.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
