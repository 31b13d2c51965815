"""Faults benchmark: a dead replica, a partitioned controller and a healed router, across hosts of their own.

One command: ``.venv/bin/python bench/faults.py [--repeats 3] [--rate 40] [--lease 6] [--renew 1]`` (as root:
each host is a network namespace, tests/integration/hosts.py). The same parts as bench/fleet.py: moto's S3 server on
``store`` (route store and record sink), a ``revgate router`` on ``edge-1`` and one on ``edge-2`` (each
signing its records), the controller's code on ``control``; the upstreams are small OpenAI-shaped
responders (what is measured is the route, not an engine), each naming its host in its answer. Stable
runs on ``gpu-1``; the candidate has one replica on ``gpu-1`` (another port) and one on ``gpu-2``. The
users are on a host of their own, ``users``: open-loop traffic at ``--rate``, half through each router,
a new session per request.

- ``dead_replica_to_no_failures_s``: the candidate at 50%; every process on ``gpu-2`` is killed (SIGKILL).
  From the first failed request (no 200) to the last one; 0 when none failed. The failed requests
  are counted beside it. Goal: at most 1 s.
- ``partitioned_controller_to_stable_s``: a controller process on ``control`` holds the candidate's
  lease (the flow's ``RouteOwner`` and ``Heartbeat``, lease ``--lease`` s, renewed every
  ``--renew`` s); ``control``'s link goes down. From the cut to the sending time of the last request
  the candidate served, through either router. Goal: at most one lease.
- ``router_heal_catch_up_s``: ``edge-1`` is cut from ``store``; control commits a new generation (and
  notifies both routers, as the flow's commit does); ``edge-1`` serves on from its last snapshot; the
  cut heals. From the heal to ``edge-1``'s admin health reporting the new generation. Goal: at most
  one poll of the route store plus one store timeout (0.5 + 5 s).

- ``last_replica_to_stable_s``: the candidate at 50% on gpu-1 and gpu-2; every process on ``gpu-2`` killed,
  then the candidate's last replica (on ``gpu-1``). From the last kill to the sending time of the last
  request stable did not answer (0 when none). Goal: at most 1 s. The routers' fallbacks are counted.
- ``cut_edge_lease_to_stable_s``: the controller holds a canary's lease; ``edge-1`` is cut from ``store``
  (its link to it down). From the end of the lease ``edge-1`` held to the sending time of the last
  request through it that the candidate served. Goal: at most 0 (the router goes by its own clock);
  ``edge-2`` serves the renewed canary meanwhile, and once healed ``edge-1`` catches up.

Beside the first figure, the same fault on a route with ``max_retries`` 0: the requests that fail in
the ``WINDOW_S`` after the kill (each router's probes of the dead replica, one request each backoff).

Median and worst of ``--repeats`` each. Writes bench/results/faults.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from bench.fleet import machine  # noqa: E402
from revgate.registry.route_store_s3 import ATTEMPTS, TIMEOUT_S  # noqa: E402
from tests.integration.host_faults import (  # noqa: E402
    POLL_S,
    WEIGHT_PPM,
    WINDOW_S,
    controller_spec,
    cut_edge_lease,
    dead_replica,
    faults_fleet,
    last_replica,
    partitioned_controller,
    router_heal,
)
from tests.integration.hosts import HOST_NAMES, Network, run_prefix, sweep_stale, why_unavailable  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "faults.json"


def summary(runs: list[dict[str, Any]], goal: float, **extra: Any) -> dict[str, Any]:
    seconds = [run["seconds"] for run in runs]
    return {"median": round(statistics.median(seconds), 3), "worst": round(max(seconds), 3), "goal": goal,
            **extra, "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=40.0, help="users' requests per second, all routers")
    parser.add_argument("--lease", type=int, default=6, help="the candidate's lease held by the controller, s")
    parser.add_argument("--renew", type=float, default=1.0, help="the controller's renewal period, s")
    args = parser.parse_args()
    missing = why_unavailable()
    if missing:
        print(f"bench/faults.py needs hosts of their own (network namespaces): {missing}; nothing measured")
        return 0
    sweep_stale(run_prefix())
    root = Path(tempfile.mkdtemp(prefix="revgate-faults-"))
    network = Network.create(run_prefix(), HOST_NAMES, root)
    dead: list[dict[str, Any]] = []
    unretried: list[dict[str, Any]] = []
    partitioned: list[dict[str, Any]] = []
    heal: list[dict[str, Any]] = []
    last: list[dict[str, Any]] = []
    cut_lease: list[dict[str, Any]] = []
    try:
        with faults_fleet(network, args.rate) as fleet:
            plane, edges = fleet.plane, fleet.edges
            spec = controller_spec(plane, edges, network["control"])
            for number in range(args.repeats):
                dead.append(dead_replica(fleet))
                print(f"dead replica {number + 1}: {dead[-1]}", flush=True)
            for number in range(args.repeats):
                run = dead_replica(fleet, retries=0, window_s=WINDOW_S)
                # Within the window only: past it the probes go on failing (one request each backoff).
                unretried.append({"first_to_last_failure_in_window_s": run.pop("seconds"), **run})
                print(f"dead replica, no retries {number + 1}: {unretried[-1]}", flush=True)
            for number in range(args.repeats):
                partitioned.append(partitioned_controller(fleet, spec, args.lease, args.renew))
                print(f"partitioned controller {number + 1}: {partitioned[-1]}", flush=True)
            for number in range(args.repeats):
                heal.append(router_heal(fleet))
                print(f"router heal {number + 1}: {heal[-1]}", flush=True)
            for number in range(args.repeats):
                last.append(last_replica(fleet))
                print(f"last replica {number + 1}: {last[-1]}", flush=True)
            for number in range(args.repeats):
                cut_lease.append(cut_edge_lease(fleet, spec, args.lease, args.renew))
                print(f"edge cut under a lease {number + 1}: {cut_lease[-1]}", flush=True)
    finally:
        network.close()
        shutil.rmtree(root, ignore_errors=True)
    figures = {
        "dead_replica_to_no_failures_s": summary(
            dead, 1.0, failed_requests=sum(run["failed"] for run in dead), max_retries=1,
            without_retries={"max_retries": 0, "window_s": WINDOW_S,
                             "failed_requests": [run["failed"] for run in unretried], "runs": unretried}),
        "partitioned_controller_to_stable_s": summary(partitioned, float(args.lease), lease_s=args.lease,
                                                      renew_s=args.renew,
                                                      failed_requests=sum(run["failed"] for run in partitioned)),
        "router_heal_catch_up_s": summary(heal, POLL_S + TIMEOUT_S, store_timeout_s=TIMEOUT_S,
                                          store_attempts=ATTEMPTS, poll_s=POLL_S,
                                          failed_requests=sum(run["failed"] for run in heal)),
        "last_replica_to_stable_s": summary(last, 1.0, failed_requests=sum(run["failed"] for run in last),
                                            fallbacks=sum(run["fallbacks"] for run in last)),
        "cut_edge_lease_to_stable_s": summary(cut_lease, 0.0, lease_s=args.lease, renew_s=args.renew,
                                              failed_requests=sum(run["failed"] for run in cut_lease)),
    }
    print("| figure | median | worst | goal | failed requests |\n|---|---|---|---|---|")
    for name, figure in figures.items():
        print(f"| {name} (of {len(figure['runs'])}) | {figure['median']} | {figure['worst']} | <= {figure['goal']} | "
              f"{figure['failed_requests']} |")
    print(f"| dead replica, route max_retries 0: failed requests in the {WINDOW_S:.0f} s after the kill | "
          f"{', '.join(str(run['failed']) for run in unretried)} | | | |")
    RESULTS.write_text(json.dumps({
        "command": " ".join(["python bench/faults.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
        "details": {"rate_rps": args.rate, "routers": 2, "weight_ppm": WEIGHT_PPM,
                    "hosts": "network namespaces: control (controller), store (moto S3), edge-1, edge-2 (routers), "
                             "gpu-1 (stable; candidate replica 1), gpu-2 (candidate replica 2), users"},
        "figures": figures}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
