"""Static checks run by the tests: ruff, mypy --strict, and the import-linter layering contracts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.lint


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / tool), *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_finds_nothing() -> None:
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_passes() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_layering_contracts_hold() -> None:
    result = run("lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr
