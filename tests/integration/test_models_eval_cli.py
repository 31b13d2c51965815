"""``revgate models eval ZOO --markdown`` (docs/models.md) as a user runs it, kept short: one revision
(``--revision stable``, one vLLM server), two prompts per slice, on a copy of the reference zoo so that
the shared zoo's measurements stay as they are."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine]


@pytest.mark.timeout(600)
def test_models_eval_serves_a_revision_measures_it_and_prints_the_docs_table(zoo_dir: Path, tmp_path: Path) -> None:
    zoo = tmp_path / "zoo"
    shutil.copytree(zoo_dir, zoo, ignore=shutil.ignore_patterns("eval"))
    done = subprocess.run([sys.executable, "-m", "revgate.cli.main", "models", "eval", str(zoo), "--markdown",
                           "--revision", "stable", "--per-slice", "2"],
                          capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert table[0].startswith("| revision | overall |"), done.stdout[-3000:]
    assert [row.split("|")[1].strip() for row in table[2:]] == ["stable"], table
    assert sorted(path.name for path in (zoo / "eval").glob("stable*.jsonl")), list((zoo / "eval").iterdir())
