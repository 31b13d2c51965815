"""Start-to-ready of a replica through the worker agent, split into its steps, against vLLM started by hand.

One command: ``python bench/worker.py [--runs 3] [--model DIR]``. Takes the reference model
``stable`` from .cache/zoo (or, without a zoo, a fresh model of the same architecture), signs it
with a fresh EC key and pushes it to a filesystem store, then alternates, ``--runs`` times each:

- **by hand**: ``serving.worker.engine`` starts vLLM on the model folder with the same flags, timed from
  the call to the first ``/health`` 200 (what an operator's script would do; nothing is verified
  and nothing warmed);
- **agent**: the real ``revgate worker`` command; timed from ``POST /v1/replicas`` to the replica
  reported ``ready``, with the agent's own split into fetch (cold cache: emptied before each run),
  verify (signature, re-hash of every byte, compatibility), engine start and warm-up.

Before the timed runs each system starts once untimed: vLLM's first start on a new model path is
up to twice as slow (one-off caches), and the two systems serve different paths.

``agent_overhead_s`` is the median, over the agent's runs, of start-to-ready minus that run's own
engine start: what fetching, verification, warm-up and the control loop add to a vLLM start,
measured within one run so that the engine's start-time noise on a shared machine cancels out.
``engine_start_difference_s`` (agent's median engine start minus by hand's) checks that the agent
starts vLLM no slower than a script does. Writes bench/results/worker.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from revgate.manifests import ExecutionConfig, InterfacePolicy, ServiceRevision
from revgate.manifests.worker import WarmProfile
from revgate.registry.build import build_manifest
from revgate.registry.runtime import engine_runtime
from revgate.registry.signing import sign_with_key
from revgate.registry.store import open_store
from revgate.serving.worker.agent import served_model_name
from revgate.serving.worker.auth import write_token
from revgate.serving.worker.client import WorkerClient
from revgate.serving.worker.engine import EngineProcess, engine_command, engine_env, engine_python, free_port
from revgate.serving.worker.request import ReplicaRequest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "worker.json"
EXECUTION = ExecutionConfig.build(dtype="float32", max_model_len=64, enforce_eager=True, max_num_seqs=16)
WARM = WarmProfile.build(prompt_lengths=[8, 24], max_tokens=16, concurrency=4, request_count=16)
STEPS = ("fetch_s", "verify_s", "engine_start_s", "warm_s")

MODEL_SCRIPT = """
import json, sys
from pathlib import Path
from revgate.zoo.recipe import Architecture
from revgate.zoo.train import new_model
from revgate.zoo import tokenizer as t
out = Path(sys.argv[1]); out.mkdir(parents=True)
new_model(Architecture(), 0).save_pretrained(out, safe_serialization=True)
(out / 'tokenizer.json').write_bytes(t.tokenizer_json())
template = "{{ bos_token }}{{ messages[0]['content'] }}"
(out / 'tokenizer_config.json').write_text(json.dumps(t.tokenizer_config(template, 64)))
(out / 'special_tokens_map.json').write_text(json.dumps(t.special_tokens_map()))
"""


def publish(model: Path, work: Path) -> ReplicaRequest:
    """Sign and push the model; the start request that pins it."""
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = work / "signer.pem", work / "signer.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    manifest = build_manifest(model)
    signature = work / "model.sig"
    sign_with_key(manifest, signature, private)
    open_store(str(work / "store")).push(model, manifest, signature)
    runtime = engine_runtime(engine_python().parent.parent)
    revision = ServiceRevision.build(name="bench", artifact=manifest, runtime=runtime, execution=EXECUTION,
                                     interface=InterfacePolicy())
    return ReplicaRequest.build(revision=revision, store=str(work / "store"),
                                signature_policy={"kind": "key", "public_key": str(public)}, warm=WARM)


def by_hand(model: Path, request: ReplicaRequest) -> float:
    """Seconds from starting vLLM on the folder to its first healthy answer."""
    port = free_port()
    command = engine_command(model, EXECUTION, port, served_model_name(request))
    engine = EngineProcess(command, engine_env(EXECUTION), port)
    started = time.monotonic()
    engine.start()
    try:
        engine.wait_healthy(600)
        return time.monotonic() - started
    finally:
        engine.stop()


def through_agent(client: WorkerClient, request: ReplicaRequest, cache: Path) -> dict[str, float]:
    """Start-to-ready through the control API with a cold cache, and the agent's split; drained after."""
    for folder in ("artifacts", "signatures"):
        shutil.rmtree(cache / folder, ignore_errors=True)
    started = time.monotonic()
    replica = client.start(request)
    view = client.wait_for(replica.replica_id, {"ready"}, 600, every_s=0.05)
    elapsed = time.monotonic() - started
    if view.state != "ready":
        raise SystemExit(f"replica did not become ready: {view.reason}")
    client.drain(replica.replica_id, 5)
    client.wait_for(replica.replica_id, {"terminated"}, 120)
    return {"start_to_ready_s": elapsed, **{step: view.timings_s[step] for step in STEPS},
            "requests_per_s_measured": view.capacity.requests_per_s}


def start_worker(work: Path) -> tuple[subprocess.Popen[bytes], WorkerClient]:
    token = "bench-token-" + os.urandom(12).hex()
    write_token(work / "token", token)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "revgate.cli.main", "worker", "--port", str(port), "--cache", str(work / "cache"),
         "--token-file", str(work / "token")], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = WorkerClient(f"http://127.0.0.1:{port}", token)
    deadline = time.monotonic() + 60
    while True:
        try:
            client.replicas()
            return process, client
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("the worker did not start") from None
            time.sleep(0.1)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="starts per system (alternating)")
    parser.add_argument("--no-prime", action="store_true", help="skip the untimed first start of each system")
    parser.add_argument("--model", type=Path, default=None,
                        help="model folder (default: the zoo's stable revision, else a fresh tiny model)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="revgate-bench-worker-") as scratch:
        work = Path(scratch)
        zoo_stable = ROOT / ".cache" / "zoo" / "models" / "stable"
        model = args.model or (zoo_stable if zoo_stable.is_dir() else None)
        if model is None:
            model = work / "model"
            subprocess.run([sys.executable, "-c", MODEL_SCRIPT, str(model)], check=True, cwd=ROOT,
                           capture_output=True)
        request = publish(model, work)
        model_bytes = sum(path.stat().st_size for path in model.rglob("*") if path.is_file())
        model_label = str(model.relative_to(ROOT)) if model.is_relative_to(ROOT) else "a fresh untrained model"
        process, client = start_worker(work)
        hand: list[float] = []
        agent: list[dict[str, float]] = []
        try:
            if not args.no_prime:
                by_hand(model, request)
                through_agent(client, request, work / "cache")
            for run in range(args.runs):
                hand.append(by_hand(model, request))
                agent.append(through_agent(client, request, work / "cache"))
                print(f"run {run + 1}: by hand {hand[-1]:.2f} s, agent {agent[-1]['start_to_ready_s']:.2f} s")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    report(args, (model_label, model_bytes), hand, agent)


def report(args: argparse.Namespace, model: tuple[str, int], hand: list[float], agent: list[dict[str, float]]) -> None:
    agent_figures = {name: median([run[name] for run in agent]) for name in agent[0]}
    hand_figures = {"start_to_ready_s": median(hand), "engine_start_s": median(hand)}
    overhead = median([run["start_to_ready_s"] - run["engine_start_s"] for run in agent])
    engine_difference = agent_figures["engine_start_s"] - hand_figures["engine_start_s"]
    print(f"\n{'figure (median of ' + str(args.runs) + ')':34} {'agent':>9} {'by hand':>9}")
    for name in ("start_to_ready_s", *STEPS):
        hand_value = f"{hand_figures[name]:9.3f}" if name in hand_figures else f"{'-':>9}"
        print(f"{name:34} {agent_figures[name]:9.3f} {hand_value}")
    print(f"{'agent_overhead_s':34} {overhead:9.3f}")
    print(f"{'engine_start_difference_s':34} {engine_difference:9.3f}")
    print(f"{'ratio agent / by hand':34} {agent_figures['start_to_ready_s'] / hand_figures['start_to_ready_s']:9.3f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "command": "python bench/worker.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "runs": args.runs,
        "model": model[0],
        "model_bytes": model[1],
        "warm_profile": json.loads(WARM.canonical()),
        "agent": agent_figures,
        "by_hand": hand_figures,
        "agent_overhead_s": overhead,
        "engine_start_difference_s": engine_difference,
        "runs_raw": {"agent": agent, "by_hand": hand},
    }, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
