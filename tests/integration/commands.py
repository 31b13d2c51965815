"""The ``revgate`` command as a user runs it: a fresh interpreter, output captured."""

from __future__ import annotations

import subprocess
import sys


def revgate(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``revgate ARGS``; never raises on a non-zero exit (tests assert on it)."""
    return subprocess.run([sys.executable, "-m", "revgate.cli.main",
                           *args], capture_output=True, text=True, check=False)
