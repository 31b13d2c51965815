"""The demo's Prefect server behind basic authentication: the string is generated into an owner-only
file, the API refuses calls without it, and a client started with the environment handed out runs flows."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from revgate.cli.status import _flow_run_state
from revgate.flows.processes import basic_auth_file, prefect_server

pytestmark = pytest.mark.servers

FLOW = """
from prefect import flow
from prefect.runtime import flow_run

@flow(name="auth-probe")
def probe() -> str:
    return f"ran {flow_run.id}"

print(probe())
"""


def status_of(url: str, auth: str | None = None, body: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})  # noqa: S310
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - local server
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_auth_file_is_made_once_for_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "state" / "prefect-auth"
    auth = basic_auth_file(path)
    user, password = auth.split(":", 1)
    assert user == "revgate" and len(password) >= 24
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert basic_auth_file(path) == auth  # kept, not regenerated


@pytest.mark.timeout(300)
def test_the_server_refuses_calls_without_the_auth_string_and_its_clients_carry_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with prefect_server(tmp_path / "prefect", auth_file=tmp_path / "prefect-auth") as env:
        api, auth = env["PREFECT_API_URL"], env["PREFECT_API_AUTH_STRING"]
        assert auth == (tmp_path / "prefect-auth").read_text().strip()
        assert status_of(f"{api}/health") == 200  # readiness probes need no credentials
        query = json.dumps({"limit": 1}).encode()
        assert status_of(f"{api}/flows/filter", body=query) == 401
        assert status_of(f"{api}/flows/filter", "revgate:wrong", body=query) == 401
        assert status_of(f"{api}/flows/filter", auth, body=query) == 200
        client = subprocess.run([sys.executable, "-c", FLOW], env={**os.environ, **env}, capture_output=True,
                                text=True, timeout=240, check=False)
        assert client.returncode == 0 and "ran" in client.stdout, client.stderr[-2000:]
        run_id = client.stdout.split("ran ")[-1].strip()
        # `revgate status` reads the flow run's state with the same string from the environment.
        monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)
        assert _flow_run_state(api, run_id, 10) == "unreachable"
        monkeypatch.setenv("PREFECT_API_AUTH_STRING", auth)
        assert _flow_run_state(api, run_id, 10) == "Completed"
