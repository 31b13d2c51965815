"""Services end with their owner: a service's own children too, and when the owner is killed outright.

The defect: ``flows.processes.service`` started Prefect, MLflow, the router and the worker agent in
their owner's process group and stopped them with one SIGTERM to the leader. What a service had
spawned itself (Prefect's and MLflow's web servers run as children) was never signalled, and an
owner killed with SIGKILL (a CI job's end, the OOM killer) left every service running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from revgate.flows.processes import service
from revgate.serving.worker.engine import free_port
from tests.integration.hosts import pid_gone
from tests.integration.rollout_estate import wait_until

pytestmark = pytest.mark.servers

# A service that spawns a helper of its own, writes both pids, then answers /health.
SERVICE = textwrap.dedent("""
    import http.server, os, subprocess, sys
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[2], "w").write(f"{os.getpid()} {helper.pid}")
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *args):
            pass
    # SIGTERM ends the server at once, without stopping its helper: as a web server's master can.
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
""")


def test_a_stopped_service_takes_what_it_spawned_with_it(tmp_path: Path) -> None:
    script, pids = tmp_path / "service.py", tmp_path / "pids"
    script.write_text(SERVICE)
    port = free_port()
    with service([sys.executable, str(script), str(port), str(pids)], f"http://127.0.0.1:{port}/",
                 tmp_path / "service.log") as process:
        leader, helper = map(int, pids.read_text().split())
        assert os.getpgid(process.pid) == process.pid, "the service does not lead a process group of its own"
        assert os.getsid(helper) == process.pid, "the service's helper is not in the service's session"
    wait_until(lambda: pid_gone(leader) and pid_gone(helper), 30, "the service and its helper gone after its stop")


def test_services_end_when_their_owner_is_killed_outright(tmp_path: Path) -> None:
    script, pids = tmp_path / "service.py", tmp_path / "pids"
    script.write_text(SERVICE)
    port = free_port()
    owner_code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from revgate.flows.processes import service
        with service([sys.executable, {str(script)!r}, "{port}", {str(pids)!r}], "http://127.0.0.1:{port}/",
                     Path({str(tmp_path / 'service.log')!r})):
            print("ready", flush=True)
            time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        leader = int(pids.read_text().split()[0])
        owner.send_signal(signal.SIGKILL)  # no cleanup of its own runs
        owner.wait(10)
        # The kernel sends the service SIGTERM when its owner dies (the parent-death signal). Its own children
        # are its to stop, as Prefect's and MLflow's servers do on SIGTERM; this one's helper is killed below.
        wait_until(lambda: pid_gone(leader), 30, "the service gone after its owner's SIGKILL")
    finally:
        owner.kill()
        owner.wait(10)
        for pid in (int(p) for p in pids.read_text().split()) if pids.exists() else ():
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)
