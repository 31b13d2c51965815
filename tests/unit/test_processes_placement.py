"""A service placed elsewhere runs under its launcher, with its host's environment and folder, and is
reached at its host's address; by default it runs here, on 127.0.0.1, with this process's environment."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

from revgate.flows.processes import LOCAL, Placement, service
from revgate.serving.worker.engine import free_port

# Answers every GET with what it runs with: its environment and working folder.
SAYS_WHERE = """
import http.server, json, os, sys
class Where(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), Where).serve_forever()
"""


def where_it_runs(at: Placement, tmp_path: Path) -> dict[str, object]:
    port = free_port()
    argv = [sys.executable, "-c", SAYS_WHERE, at.host, str(port)]
    with service(argv, f"{at.url(port)}/", tmp_path / "where.log", env={"GIVEN": "by-the-service"}, at=at), \
            urllib.request.urlopen(f"{at.url(port)}/", timeout=10) as answer:  # noqa: S310 - local http
        return dict(json.loads(answer.read()))


def test_a_placed_service_runs_under_its_launcher_with_its_hosts_environment_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "host"
    folder.mkdir()
    at = Placement(launcher=("env", "LAUNCHED=yes"), environ={"PATH": os.environ["PATH"], "HOST_ONLY": "1"},
                   cwd=folder)
    seen = where_it_runs(at, tmp_path)
    env = seen["env"]
    assert isinstance(env, dict)
    assert env["LAUNCHED"] == "yes" and env["HOST_ONLY"] == "1" and env["GIVEN"] == "by-the-service"
    assert "PYTEST_CURRENT_TEST" not in env  # nothing of this process's environment it was not given
    assert seen["cwd"] == str(folder)


def test_by_default_a_service_runs_here_with_this_processs_environment(tmp_path: Path) -> None:
    seen = where_it_runs(LOCAL, tmp_path)
    env = seen["env"]
    assert isinstance(env, dict)
    assert env["GIVEN"] == "by-the-service" and "PYTEST_CURRENT_TEST" in env
    assert seen["cwd"] == os.getcwd() and LOCAL.host == "127.0.0.1"
