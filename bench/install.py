"""Installed size of each host's part: the wheel in a fresh environment per extra.

One command: ``python bench/install.py``. Builds the wheel of this checkout (``python -m build``),
installs it into a fresh virtual environment per host kind (the bare install, ``[router]``,
``[worker]``, ``[control]``, ``[zoo]``, and everything but dev tools), and measures each
environment's size on disk beside an empty environment's (pip and setuptools alone), the packages
it holds, and how long pip took (from pip's cache when the machine has one). Prints a table and
writes bench/results/install.json; docs/fleet.md quotes it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import package_view  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "install.json"
HOSTS = {"empty": None, "bare": "", "router": "[router]", "worker": "[worker]", "control": "[control]",
         "zoo": "[zoo]", "all": "[router,worker,control,zoo]"}
PROBES = ("prefect", "mlflow", "scipy", "torch", "transformers", "model_signing", "uvicorn", "httptools")


def size_bytes(folder: Path) -> int:
    return sum(path.lstat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


def install(env: Path, target: str | None) -> float:
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    start = time.monotonic()
    if target is not None:
        subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        target], check=True, capture_output=True)
    return time.monotonic() - start


def facts(env: Path) -> tuple[int, list[str]]:
    """How many distributions the environment holds, and which of PROBES it can import."""
    code = ("import importlib.metadata as m, importlib.util as u, json; "
            f"print(json.dumps([len(list(m.distributions())), [p for p in {list(PROBES)!r} if u.find_spec(p)]]))")
    done = subprocess.run([str(env / "bin" / "python"), "-c", code], cwd=env, check=True, capture_output=True,
                          text=True)
    count, present = json.loads(done.stdout)
    return int(count), list(present)


def main() -> None:
    figures: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="revgate-install-") as scratch:
        wheel = package_view.build_wheel(Path(scratch) / "dist")
        for host, extra in HOSTS.items():
            env = Path(scratch) / host
            seconds = install(env, None if extra is None else f"{wheel}{extra}")
            count, present = facts(env)
            figures[host] = {"bytes": size_bytes(env), "distributions": count, "importable": present,
                             "install_seconds": round(seconds, 1)}
            print(f"{host}: {figures[host]['bytes'] / 1e6:.0f} MB", file=sys.stderr)
    empty = figures["empty"]["bytes"]
    for values in figures.values():
        values["mb_over_empty"] = round((values["bytes"] - empty) / 1e6, 1)
    print(f"\n{'host kind':<10}{'extra':<36}{'MB over empty':>15}{'packages':>10}{'pip s':>8}  importable")
    for host, extra in HOSTS.items():
        values = figures[host]
        shown = "-" if extra is None else f"revgate{extra}"
        print(f"{host:<10}{shown:<36}{values['mb_over_empty']:>15}{values['distributions']:>10}"
              f"{values['install_seconds']:>8}  {', '.join(values['importable']) or '-'}")
    ratio = {host: round(figures[host]["mb_over_empty"] / figures["all"]["mb_over_empty"], 3)
             for host in ("bare", "router", "worker", "control", "zoo")}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "installed_mb": {host: figures[host]["mb_over_empty"] for host in HOSTS if host != "empty"},
        "share_of_everything": ratio,
        "hosts": figures,
        "command": "python bench/install.py",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
