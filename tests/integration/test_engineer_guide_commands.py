"""The ML engineer's guide (docs/engineer.md) run as shown: publishing a revision with openssl and
revgate, following a route with ``revgate status`` and rolling it back with ``revgate rollback``.
The commands run one after another in one folder, and each prints what the guide says it prints
(the digest in full where the guide shortens it).

Only the stores move: the guide's ``/srv/artifacts`` and ``/srv/routes`` are folders of the test's own.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from revgate.manifests.route import RevisionTarget, RouteSnapshot
from revgate.manifests.route_change import canary, successor
from revgate.registry.route_store import open_route_store
from tests.unit.test_docs_commands import ROOT, Shown, commands_in

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
            argv = [sys.executable, "-m", "revgate.cli.main", *argv[1:]]
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


def shown_with_output(text: str) -> tuple[Shown, list[str]]:
    """The guide's command ``text`` and the output it shows under it, up to the next command or the block's end."""
    lines = GUIDE.read_text(encoding="utf-8").split("\n")
    (command,) = [c for c in commands_in(GUIDE) if c.text == text]
    output = []
    for line in lines[command.line:]:
        if line.startswith(("revgate", "```")):
            break
        output.append(line)
    return command, output


def run_as_shown(text: str, routes: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(text.replace("/srv/routes", str(routes)))
    return subprocess.run([sys.executable, "-m", "revgate.cli.main", *argv[1:]], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_engineer_guide_follows_and_rolls_back_a_canary_as_shown(tmp_path: Path) -> None:
    routes = tmp_path / "srv-routes"
    store = open_route_store(str(routes))
    now = datetime.now(UTC)
    stable = RevisionTarget(fingerprint="sha256:" + "1" * 64, endpoints=("http://127.0.0.1:9001",))
    candidate = RevisionTarget(fingerprint="sha256:" + "2" * 64, endpoints=("http://127.0.0.1:9002",))
    first = RouteSnapshot.build(route="chat", generation=1, stable=stable, created_by="seed", created_at=now)
    store.write(first)
    store.write(successor(first, by="flow", now=now, candidate=canary(candidate, 50_000, now, 600)))

    status, shown = shown_with_output("revgate status chat --routes /srv/routes")
    done = run_as_shown(status.text, routes, tmp_path)
    assert done.returncode == 1, done.stderr  # rolling out
    assert done.stdout.splitlines() == shown, f"{status.where()}\nprinted:\n{done.stdout}"

    dry, shown = shown_with_output("revgate rollback --routes /srv/routes --route chat --created-by ana --dry-run")
    done = run_as_shown(dry.text, routes, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == shown, f"{dry.where()}\nprinted:\n{done.stdout}"
    assert store.read("chat").generation == 2  # a dry run commits nothing
