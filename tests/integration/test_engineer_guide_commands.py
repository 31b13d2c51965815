"""The ML engineer's guide (docs/engineer.md) publishes a revision with openssl and revgate: its
commands are run here as the guide shows them, one after another in one folder, and each prints
what the guide says it prints (the digest in full where the guide shortens it).

Only the store moves: the guide's ``/srv/artifacts`` is a folder of the test's own.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.unit.test_docs_commands import ROOT, commands_in

GUIDE = ROOT / "docs" / "engineer.md"
SHORTENED = re.compile(r"sha256:[0-9a-f]+\\\.\\\.\\\.")


def publishing_commands() -> list[tuple[str, str]]:
    """(command, the output line the guide shows under it) for the guide's publishing block, in order."""
    lines = GUIDE.read_text(encoding="utf-8").split("\n")
    shown = [c for c in commands_in(GUIDE) if c.text.startswith(("openssl", "revgate manifest", "revgate sign",
                                                                 "revgate verify", "revgate push"))]
    out = []
    for command in shown:
        following = lines[command.line].strip()  # the line after the command (line numbers count from 1)
        printed = "" if following.startswith(("openssl", "revgate")) or not following else following
        out.append((command.text, printed))
    return out


def test_the_engineer_guide_publishes_a_revision_as_shown(tmp_path: Path) -> None:
    commands = publishing_commands()
    assert [text.split()[:2] for text, _ in commands] == [
        ["openssl", "ecparam"], ["openssl", "ec"], ["revgate", "manifest"], ["revgate", "sign"], ["revgate", "verify"],
        ["revgate", "push"]]
    model = tmp_path / "improved"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}\n')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    store = tmp_path / "srv-artifacts"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    digests = set()
    for text, printed in commands:
        argv = shlex.split(text.replace("/srv/artifacts", str(store)))
        if argv[0] == "revgate":
            argv = [sys.executable, "-m", "cli.main", *argv[1:]]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{text}\n{done.stdout}{done.stderr}"
        if printed:
            expected = SHORTENED.sub("sha256:[0-9a-f]{64}", re.escape(printed))
            assert re.fullmatch(expected, done.stdout.strip()), f"{text}: printed {done.stdout!r}, guide: {printed!r}"
            digests |= set(re.findall(r"sha256:[0-9a-f]{64}", done.stdout))
    assert len(digests) == 1  # one manifest digest: built, signed, verified and pushed
    (digest,) = digests
    assert (tmp_path / "key.pem").is_file() and (tmp_path / "improved.sig").is_file()
    assert any(digest.removeprefix("sha256:") in path.name for path in store.rglob("*")), list(store.rglob("*"))[:5]
