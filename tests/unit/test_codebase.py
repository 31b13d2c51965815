"""Static checks run by the tests: ruff, mypy --strict, and the import-linter layering contracts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import package_view

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
VIEW = ROOT / ".cache" / "package-view"
pytestmark = pytest.mark.lint


def run(tool: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / tool), *args], cwd=cwd, capture_output=True, text=True, check=False)


def on_the_package(tool: str, *args: str) -> tuple[int, str]:
    """``tool`` run where ``import revgate`` finds the package tree; its exit code and output."""
    package_view.build(VIEW)
    result = run(tool, *args, cwd=VIEW)
    return result.returncode, package_view.to_source_paths(result.stdout + result.stderr)


def test_ruff_finds_nothing() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_passes() -> None:
    code, output = on_the_package("mypy", "--config-file", str(ROOT / "pyproject.toml"),
                                  "--cache-dir", str(ROOT / ".mypy_cache"))
    assert code == 0, output


def test_layering_contracts_hold() -> None:
    code, output = on_the_package("lint-imports", "--config", str(ROOT / "pyproject.toml"), "--no-cache")
    assert code == 0, output


def test_the_package_tree_mirrors_every_source_file() -> None:
    package_view.build(VIEW)
    linked = {path.resolve() for path in (VIEW / "revgate").rglob("*.py")}
    sources = {path.resolve() for folder in package_view.package_dirs().values() for path in folder.rglob("*.py")
               if "__pycache__" not in path.parts}
    assert linked == sources and ROOT / "serving" / "router" / "service.py" in linked
