"""The `revgate` package as the static checkers see it: one folder tree of links to the sources.

pyproject.toml maps each top-level folder (flows/, serving/, ...) into the one import name
`revgate`. Installs and the editable install follow that mapping; mypy and import-linter walk
folders instead, so the checks run on a tree that mirrors the mapping: real folders, one link per
source file (a linked folder is not walked), rebuilt from the sources on every run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Each subpackage of `revgate` and its folder in the repository, from pyproject.toml."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {name: root / folder for name, folder in setuptools["package-dir"].items()}
    return {"revgate": root / "revgate", **mapped}


def build(dest: Path, root: Path = ROOT) -> Path:
    """Write the tree under ``dest`` (replacing an older one); the folder that holds ``revgate``."""
    shutil.rmtree(dest, ignore_errors=True)
    for name, source in package_dirs(root).items():
        target = dest.joinpath(*name.split("."))
        for file in source.rglob("*.py"):
            if "__pycache__" in file.parts:
                continue
            link = target / file.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(file)
    return dest


def to_source_paths(text: str, root: Path = ROOT) -> str:
    """Checker output with the tree's paths turned back into the repository's own."""
    for name, source in sorted(package_dirs(root).items(), key=lambda item: -len(item[0])):
        text = text.replace(str(Path(*name.split("."))) + "/", str(source.relative_to(root)) + "/")
    return text


def build_wheel(out: Path, root: Path = ROOT) -> Path:
    """``python -m build --wheel`` of the checkout's files as they are now, built from a copy.

    The copy holds what git tracks or would track (untracked files included, ignored ones not), so
    no stale ``build/`` or ``*.egg-info`` of the checkout reaches the wheel, and the checkout gets
    none. Built with this environment's setuptools (no download); the wheel's path.
    """
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode()
    with tempfile.TemporaryDirectory(prefix="revgate-wheel-") as scratch:
        source = Path(scratch) / "revgate"
        for name in filter(None, listed.split("\0")):
            if (root / name).is_file():
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / name, source / name)
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)],
                       capture_output=True, check=True, timeout=600)
    return next(out.glob("revgate-*.whl"))
