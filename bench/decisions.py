"""Decisions benchmark: how the demo's plan and gate policy decide, measured on whole rollouts of the real system.

One command: ``.venv/bin/python bench/decisions.py [--per-kind 10] [--kinds a,b,...] [--counts k=n,...]
[--short]`` (on demand; hours at the default). Real parts, started once per run: a Prefect server, a
worker agent running vLLM on the CPU, a router with users' traffic through it, MLflow on SQLite. Then, one at a time and
kinds interleaved (so that drift on the host hits every kind alike), whole rollouts of
``demo_plan()`` and ``demo_policy()`` from stable alone on the route to a decision, for:

- the A/A kinds ``stable-copy`` (stable's files under a new artifact digest) and
  ``stable-reconfigured`` (stable's artifact under another execution config): any rollback is a
  false alarm;
- ``improved`` (should be promoted), ``slow`` (should be caught by a latency or SLO gate),
  ``slice-regressed`` (should be caught by a quality gate on its ``sort/long`` slice).

Per rollout: the decision (the flow's, from its MLflow evidence run), the failing gates and slices
of its last gate report, the stage it was decided in and the time from ``revgate promote`` to the
route change that carried the decision (both from the route history).

Results accumulate in bench/results/decisions.json per gate-code digest (a sha256 over the sources
that decide, see DECIDING, and the source of ``demo_policy`` and ``demo_plan``): a run under the same
digest adds its rollouts to that digest's entry; changed code starts a new entry beside the old ones.
``--short`` is a smoke check: one rollout of each of two kinds. ``--counts`` tops an entry up: its
rollouts spread out so that each kind keeps its share of every stretch of the run.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one line per rollout, not per download

from mlflow.tracking import MlflowClient  # noqa: E402

from revgate.flows.demo import (  # noqa: E402
    AA_CANDIDATES,
    ROUTE,
    DemoRollout,
    DemoSession,
    demo_plan,
    demo_policy,
    demo_session,
)
from revgate.flows.steps import pin  # noqa: E402
from revgate.manifests.route import RouteSnapshot  # noqa: E402
from revgate.registry.route_store import open_route_store  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "decisions.json"
STATE = ROOT / ".cache" / "bench" / "decisions"  # wiped at the start of each run, kept after it for its logs
KINDS = (*AA_CANDIDATES, "improved", "slow", "slice-regressed")
SHORT_KINDS = ("stable-reconfigured", "slice-regressed")  # an A/A promotion, then a rollback on a fresh stable
# The sources whose code decides a rollout; with the demo's policy and plan they make the gate-code digest.
DECIDING = ("evaluation/*.py", "manifests/gates.py", "manifests/rollout.py", "flows/promote.py", "flows/evidence.py",
            "flows/sizing.py",
            # where the engines compute decides what their latency gates measure
            "serving/worker/cores.py", "serving/worker/engine.py", "serving/worker/agent.py")
# Taken when the bench starts: every rollout of the run uses the policy and plan imported then.
POLICY_SOURCE = inspect.getsource(demo_policy) + inspect.getsource(demo_plan)
FLOW_WRITER = "revgate promote_revision"  # the created_by of the flow's own route changes
ROLLOUT_S = 900  # users' traffic lasts this long per planned rollout (it must outlast the run)


def gate_code_digest() -> tuple[str, list[str]]:
    """sha256 over the deciding sources as they are on disk now, and the demo's policy and plan; the files."""
    files = sorted({path for pattern in DECIDING for path in ROOT.glob(pattern)})
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(ROOT)}\0".encode() + path.read_bytes() + b"\0")
    digest.update(POLICY_SOURCE.encode())
    return "sha256:" + digest.hexdigest(), [str(path.relative_to(ROOT)) for path in files]


# --- one rollout's decision, read back from its evidence --------------------------------------------

def evidence_run(client: MlflowClient, fingerprint: str, since_s: float) -> Any:
    """The newest MLflow evidence run of the candidate started since ``since_s``, or None."""
    experiment = client.get_experiment_by_name(f"revgate/{ROUTE}")
    if experiment is None:
        return None
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=5)
    return next((run for run in runs if run.data.tags.get("revgate.candidate") == fingerprint
                 and run.info.start_time >= since_s * 1000 - 1000), None)


def read_json(client: MlflowClient, run_id: str, path: str, folder: Path) -> dict[str, Any]:
    """One JSON artifact of the run."""
    folder.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = json.loads(Path(client.download_artifacts(run_id, path, str(folder))).read_text())
    return data


def gate_evidence(tracking_uri: str, fingerprint: str, since_s: float, folder: Path) -> dict[str, Any]:
    """The flow's decision and reason, and the failing gates and slices of the run's last gate report."""
    client = MlflowClient(tracking_uri)
    run = evidence_run(client, fingerprint, since_s)
    if run is None:
        return {"flow_decision": "no evidence run", "reason": "", "failed": [], "report": None}
    paths = [a.path for a in client.list_artifacts(run.info.run_id, "evidence")]
    reports = sorted(p for p in paths if "gate-report" in p and p.endswith(".json"))
    report = read_json(client, run.info.run_id, reports[-1], folder) if reports else None
    decided = read_json(client, run.info.run_id, "evidence/decision.json", folder) \
        if "evidence/decision.json" in paths else {}
    failed = [{"gate": g["gate"], "slices": [s["slice"] for s in g.get("slices", ()) if s["outcome"] == "fail"]}
              for g in (report or {}).get("gates", ()) if g["outcome"] == "fail"]
    return {"flow_decision": run.data.tags.get("revgate.decision", decided.get("decision", "unknown")),
            "reason": str(decided.get("reason", "")), "failed": failed,
            "report": reports[-1].rsplit("/", 1)[-1] if reports else None,
            "report_outcome": report.get("outcome") if report else None}


def stage_before(snapshot: RouteSnapshot, fingerprint: str) -> str:
    """What the candidate had on the route in ``snapshot``: the stage a decision right after it was taken in."""
    if snapshot.stable.fingerprint == fingerprint:
        return "rollback window"
    if snapshot.candidate is not None:
        return f"canary {snapshot.candidate.weight_ppm / 10_000:g}%"
    return "shadow" if snapshot.shadow is not None else "before traffic"


def route_timing(routes: str, fingerprint: str, started_s: float) -> dict[str, Any]:
    """From the route history: the stage the decision was taken in and when its route change came."""
    since = datetime.fromtimestamp(started_s, UTC)
    history = [s for s in open_route_store(routes).history(ROUTE) if s.created_at >= since]
    by_flow = [index for index, s in enumerate(history) if s.created_by == FLOW_WRITER]
    if not by_flow:
        return {"stage": "before traffic", "decided_s": None, "traffic_s": None}
    decision = history[by_flow[-1]]  # the flow's last write carries its decision (the leases end with it)
    stage = stage_before(history[by_flow[-1] - 1], fingerprint) if by_flow[-1] > 0 else "before traffic"
    traffic = next((s for s in history if s.created_by == FLOW_WRITER and (s.candidate or s.shadow)), None)
    return {"stage": stage, "decided_s": decision.created_at.timestamp(),
            "traffic_s": traffic.created_at.timestamp() if traffic else None}


def measure(session: DemoSession, done: DemoRollout, digest: str, folder: Path) -> dict[str, Any]:
    """One rollout's record: kind, decision, the gate that decided, stage and time to decision."""
    fingerprint = pin(done.spec)[0].fingerprint  # as the flow pinned it: manifest, this engine, the execution config
    evidence = gate_evidence(done.spec.tracking_uri, fingerprint, done.started_s, folder)
    timing = route_timing(session.routes, fingerprint, done.started_s)
    flow_decision = str(evidence["flow_decision"])
    decision = flow_decision if flow_decision in ("promoted", "rolled_back") else "other"
    first = evidence["failed"][0] if evidence["failed"] else None
    decided_s = timing["decided_s"] or done.ended_s
    return {
        "kind": done.candidate, "decision": decision, "flow_decision": flow_decision, "exit_code": done.code,
        "gate": first["gate"] if first and decision == "rolled_back" else None,
        "slice": (first["slices"] or [None])[0] if first and decision == "rolled_back" else None,
        "failed": evidence["failed"], "reason": evidence["reason"], "last_report": evidence["report"],
        "last_report_outcome": evidence.get("report_outcome"), "stage": timing["stage"],
        "time_to_decision_s": round(decided_s - done.started_s, 1),
        "gated_s": round(decided_s - timing["traffic_s"], 1) if timing["traffic_s"] else None,
        "wall_s": round(done.ended_s - done.started_s, 1), "fingerprint": fingerprint, "gate_code_digest": digest,
        "date": datetime.fromtimestamp(done.started_s, UTC).isoformat(timespec="seconds"),
    }


# --- figures ------------------------------------------------------------------------------------

def rate(records: Sequence[dict[str, Any]], hit: Any) -> float | None:
    """The share of ``records`` for which ``hit`` holds; None without records."""
    return round(sum(1 for r in records if hit(r)) / len(records), 3) if records else None


def caught_by_timing(record: dict[str, Any]) -> bool:
    """Rolled back by a latency or SLO gate."""
    return record["decision"] == "rolled_back" and any(
        f["gate"].startswith(("latency", "slo")) for f in record["failed"])


def caught_on_its_slice(record: dict[str, Any]) -> bool:
    """Rolled back by a quality gate failing on the sort/long slice."""
    return record["decision"] == "rolled_back" and any(
        f["gate"].startswith("quality") and any("sort" in s and "long" in s for s in f["slices"])
        for f in record["failed"])


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median and 90th percentile (inclusive; the value itself for one)."""
    if not values:
        return None
    p90 = statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
    return {"median": round(statistics.median(values), 1), "p90": round(p90, 1)}


def figures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures over one digest's rollouts."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_kind.setdefault(record["kind"], []).append(record)

    def promoted(record: dict[str, Any]) -> bool:
        return bool(record["decision"] == "promoted")

    aa = [r for kind in AA_CANDIDATES for r in by_kind.get(kind, [])]
    return {
        "rollouts_per_kind": {kind: len(rows) for kind, rows in by_kind.items()},
        "aa_promoted_rate": {"both": rate(aa, promoted),
                             **{kind: rate(by_kind.get(kind, []), promoted) for kind in AA_CANDIDATES}},
        "improved_promoted_rate": rate(by_kind.get("improved", []), promoted),
        "slow_caught_by_latency_or_slo_rate": rate(by_kind.get("slow", []), caught_by_timing),
        "slice_regressed_caught_on_its_slice_rate": rate(by_kind.get("slice-regressed", []), caught_on_its_slice),
        "time_to_decision_s": {kind: spread([r["time_to_decision_s"] for r in rows]) for kind, rows in by_kind.items()},
    }


# --- results file -------------------------------------------------------------------------------

def machine() -> str:
    """The host, as the other benchmarks name it."""
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}"


def load_results() -> dict[str, Any]:
    """The results file as it was when the run started (entries by digest), or an empty one."""
    if RESULTS.exists():
        data: dict[str, Any] = json.loads(RESULTS.read_text())
        return data
    return {"entries": {}}


def merged(before: dict[str, Any], records: Sequence[dict[str, Any]], run: dict[str, Any],
           sources: dict[str, list[str]]) -> dict[str, Any]:
    """``before`` with this run's rollouts appended to their digests' entries; the figures of the current one."""
    entries = json.loads(json.dumps(before.get("entries", {})))
    for digest in dict.fromkeys(r["gate_code_digest"] for r in records):
        mine = [r for r in records if r["gate_code_digest"] == digest]
        entry = entries.setdefault(digest, {"sources": sources[digest], "runs": [], "rollouts": []})
        entry["runs"].append({**run, "rollouts": len(mine)})
        entry["rollouts"] += mine
        entry["figures"] = figures(entry["rollouts"])
    current = records[-1]["gate_code_digest"] if records else before.get("gate_code_digest")
    head = entries[current]["figures"] if current in entries else {}
    return {"gate_code_digest": current, **head, **run, "entries": entries}


def save(data: dict[str, Any]) -> None:
    """Write the results file whole (a reader never sees half of it)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(RESULTS)


# --- output -------------------------------------------------------------------------------------

def gate_text(record: dict[str, Any]) -> str:
    """The gate that decided, with its slice; for a rollback with no failing gate, the start of the reason."""
    if record["decision"] != "rolled_back":
        return "-"
    if record["gate"]:
        return str(record["gate"]) + (f" @ {record['slice']}" if record["slice"] else "")
    return str(record["reason"] or record["last_report_outcome"] or "?")[:48]


def progress(index: int, total: int, record: dict[str, Any]) -> None:
    """One line per rollout."""
    print(f"[{index}/{total}] {record['kind']:<20} {record['decision']:<12} {gate_text(record):<48} "
          f"{record['time_to_decision_s']:>7.1f} s  ({record['stage']})", flush=True)


def table(data: dict[str, Any]) -> None:
    """The current digest's figures: per kind, then the headline rates."""
    digest = data.get("gate_code_digest") or ""
    rows = data["entries"].get(digest, {}).get("rollouts", [])
    print(f"\ngate code {digest[:19]}: {len(rows)} rollouts")
    print(f"{'kind':<22}{'n':>4}{'promoted':>10}{'rolled back':>13}{'other':>7}{'median s':>10}{'p90 s':>8}")
    for kind, count in data["rollouts_per_kind"].items():
        mine = [r for r in rows if r["kind"] == kind]
        times = data["time_to_decision_s"][kind] or {}
        counts = [sum(r["decision"] == d for r in mine) for d in ("promoted", "rolled_back", "other")]
        print(f"{kind:<22}{count:>4}{counts[0]:>10}{counts[1]:>13}{counts[2]:>7}"
              f"{times.get('median', 0):>10.1f}{times.get('p90', 0):>8.1f}")
    for name in ("aa_promoted_rate", "improved_promoted_rate", "slow_caught_by_latency_or_slo_rate",
                 "slice_regressed_caught_on_its_slice_rate"):
        print(f"{name:<42} {json.dumps(data[name])}")


# --- the run ------------------------------------------------------------------------------------

def stop_on_sigterm() -> None:
    """SIGTERM ends the run like Ctrl-C, so every service is stopped by the block that started it."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def run(order: Sequence[str], command: str) -> None:
    """Every rollout of ``order`` in one demo session; the results file rewritten after each."""
    before = load_results()
    run_facts: dict[str, Any] = {"command": command, "date": datetime.now(UTC).isoformat(timespec="seconds"),
                                 "machine": machine()}
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    records: list[dict[str, Any]] = []
    sources: dict[str, list[str]] = {}
    data = merged(before, records, run_facts, sources)
    kinds = tuple(dict.fromkeys(order))
    with demo_session(STATE, ROOT / ".cache" / "zoo", kinds, users_s=ROLLOUT_S * len(order) + 600) as session:
        for index, kind in enumerate(order, 1):
            digest, files = gate_code_digest()
            sources[digest] = files
            done = session.rollout(kind, log=STATE / "logs" / f"{index:03d}-{kind}.log")
            records.append(measure(session, done, digest, STATE / "evidence-read" / f"{index:03d}"))
            # Other work on the host lands on one engine's cores: the load each rollout ran under, for reading it.
            records[-1]["load_average_5min"] = round(os.getloadavg()[1], 2)
            progress(index, len(order), records[-1])
            run_facts["load_average_1min"] = round(os.getloadavg()[0], 2)
            data = merged(before, records, run_facts, sources)
            save(data)
    if records:
        table(data)
    if len(seen := set(sources)) > 1:
        print(f"this run's rollouts fell under {len(seen)} gate-code digests (the deciding sources changed during "
              "the run); each digest's entry in the results holds its own")


def planned(kinds: Iterable[str], per_kind: int) -> list[str]:
    """Kinds interleaved: round after round of one rollout each."""
    names = list(kinds)
    return [kind for _ in range(per_kind) for kind in names]


def planned_counts(counts: dict[str, int]) -> list[str]:
    """Given counts per kind, spread out: each next rollout is of the kind furthest behind its share."""
    total = sum(counts.values())
    done = dict.fromkeys(counts, 0)
    order: list[str] = []
    for step in range(1, total + 1):
        kind = max((k for k in counts if done[k] < counts[k]), key=lambda k: counts[k] * step / total - done[k])
        done[kind] += 1
        order.append(kind)
    return order


def counts_of(text: str) -> dict[str, int]:
    """``kind=N,kind=N`` (what a digest's entry still lacks, say) as counts; a clear error for anything else."""
    counts: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, number = item.partition("=")
        if kind not in KINDS or not number.isdigit():
            raise SystemExit(f"--counts: {item!r} is not KIND=N with KIND one of {', '.join(KINDS)}")
        counts[kind] = int(number)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-kind", type=int, default=10, help="rollouts of each kind")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated (default: {','.join(KINDS)})")
    parser.add_argument("--short", action="store_true", help=f"smoke check: one rollout each of {SHORT_KINDS}")
    parser.add_argument("--counts", help="rollouts per kind, KIND=N,... (interleaved; instead of --per-kind)")
    parser.add_argument("--order", help="the rollouts one by one, KIND,KIND,... (instead of --per-kind)")
    args = parser.parse_args()
    kinds = SHORT_KINDS if args.short else tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    stop_on_sigterm()
    started = time.monotonic()
    per_kind = 1 if args.short else args.per_kind
    order = planned_counts(counts_of(args.counts)) if args.counts else planned(kinds, per_kind)
    if args.order:
        order = [kind for kind in (part.strip() for part in args.order.split(",")) if kind]
        if unknown := sorted(set(order) - set(KINDS)):
            raise SystemExit(f"--order: unknown kinds {unknown}; kinds are {', '.join(KINDS)}")
    run(order, "python bench/decisions.py " + " ".join(sys.argv[1:]))
    print(f"({time.monotonic() - started:.0f} s; state and logs in {STATE.relative_to(ROOT)})")


if __name__ == "__main__":
    main()
