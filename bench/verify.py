"""Verification throughput of a multi-GB model folder against sha256sum and openssl, in one run.

One command: ``python bench/verify.py [--size-gb 2] [--shards 8] [--repeats 3]``. Generates a
folder of random "weight" shards once into .cache/bench (reused while the size matches), signs
its manifest with a fresh EC key, then times over the same files, after one warm-up pass so
every system reads from the page cache:

- revgate verify (registry.verify.verify_artifact: signature, signer, file set, sha256 of every
  byte) with 1 hashing worker and with 2;
- ``sha256sum`` over all shards (one process, one core);
- ``openssl dgst -sha256`` over all shards (one process, one core).

Each figure is the best of ``--repeats`` runs (the least disturbed by other work on a shared
machine). Writes bench/results/verify.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from revgate.manifests.artifact import ArtifactManifest
from revgate.registry.build import build_manifest
from revgate.registry.signing import KeyPolicy, sign_with_key
from revgate.registry.verify import verify_artifact

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench" / "verify"
RESULTS = ROOT / "bench" / "results" / "verify.json"
CHUNK = 64 * 1024 * 1024


def make_model(folder: Path, total: int, shards: int) -> list[Path]:
    """Random shards totalling ``total`` bytes, generated once and reused."""
    each = total // shards
    paths = [folder / f"model-{index + 1:05d}-of-{shards:05d}.safetensors" for index in range(shards)]
    if all(path.is_file() and path.stat().st_size == each for path in paths):
        return paths
    if folder.exists():
        for stale in folder.iterdir():
            stale.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    for path in paths:
        with path.open("wb") as stream:
            left = each
            while left:
                chunk = os.urandom(min(CHUNK, left))
                stream.write(chunk)
                left -= len(chunk)
    (folder / "config.json").write_text('{"hidden_size": 4096, "num_attention_heads": 32}')
    return paths


def signed(folder: Path, keys: Path) -> tuple[ArtifactManifest, Path, KeyPolicy]:
    """Pin and sign the folder with a fresh EC key (outside the folder)."""
    keys.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    (keys / "bench.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    (keys / "bench.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    manifest = build_manifest(folder)
    signature = keys / "model.sig"
    sign_with_key(manifest, signature, keys / "bench.pem")
    return manifest, signature, KeyPolicy(keys / "bench.pub")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def best_seconds(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Fastest wall time of ``repeats`` runs, and the least CPU time (this process plus tools it ran)."""
    walls, cpus = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), _cpu_seconds()
        run()
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu_seconds() - cpu)
    return min(walls), min(cpus)


def tool(command: list[str]) -> Callable[[], object]:
    """A runner for an external hashing tool; its output is discarded."""
    return lambda: subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    """Run the comparison, print the table, write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-gb", type=float, default=2.0, help="model size in GB (default 2)")
    parser.add_argument("--shards", type=int, default=8, help="number of weight files (default 8)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    folder = CACHE / "model"
    shards = make_model(folder, int(args.size_gb * 1e9), args.shards)
    manifest, signature, policy = signed(folder, CACHE / "keys")
    files = [str(path) for path in sorted(folder.iterdir())]
    total = manifest.total_size
    systems: dict[str, Callable[[], object]] = {
        "revgate_1_worker": lambda: verify_artifact(folder, manifest, signature, policy, workers=1),
        "revgate_2_workers": lambda: verify_artifact(folder, manifest, signature, policy, workers=2),
        "sha256sum": tool(["sha256sum", *files]),
        "openssl": tool(["openssl", "dgst", "-sha256", *files]),
    }
    for run in systems.values():  # warm-up: every system then reads from the page cache
        run()
    measured = {name: best_seconds(run, args.repeats) for name, run in systems.items()}
    seconds = {name: wall for name, (wall, _) in measured.items()}
    cpu = {name: used for name, (_, used) in measured.items()}
    gbps = {name: total / value / 1e9 for name, value in seconds.items()}
    fastest_tool = max(gbps["sha256sum"], gbps["openssl"])
    figures = {
        "verify_gbps_per_core": round(gbps["revgate_1_worker"], 3),
        "sha256sum_gbps": round(gbps["sha256sum"], 3),
        "openssl_gbps": round(gbps["openssl"], 3),
        "verify_speedup_2_cores": round(seconds["revgate_1_worker"] / seconds["revgate_2_workers"], 3),
        "verify_per_core_vs_fastest_tool": round(gbps["revgate_1_worker"] / fastest_tool, 3),
    }
    print(f"{total / 1e9:.2f} GB in {len(shards)} shards + config; best of {args.repeats} after a warm-up\n")
    print(f"{'system':<20}{'seconds':>10}{'GB/s':>10}{'vs fastest tool':>18}{'CPU s':>10}{'GB/CPU-s':>10}")
    for name in systems:
        print(f"{name:<20}{seconds[name]:>10.3f}{gbps[name]:>10.3f}{gbps[name] / fastest_tool:>18.3f}"
              f"{cpu[name]:>10.3f}{total / cpu[name] / 1e9:>10.3f}")
    print()
    for name, value in figures.items():
        print(f"{name:<34}{value}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        **figures,
        "systems": {name: {"seconds": round(seconds[name], 4), "gbps": round(gbps[name], 3),
                           "cpu_seconds": round(cpu[name], 4), "gb_per_cpu_second": round(total / cpu[name] / 1e9, 3)}
                    for name in systems},
        "load_average_1min": round(os.getloadavg()[0], 2),
        "bytes": total,
        "files": len(shards) + 1,
        "repeats": args.repeats,
        "command": "python bench/verify.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
